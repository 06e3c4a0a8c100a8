// cache_aware over token ids: with --tokenizer, prefix trees hold the prompt's token ids, the unit a
// backend's radix cache matches on, instead of its bytes.
#include "common/error.h"
#include "router/request_info.h"
#include "text/tokenizer.h"

namespace moeserve::router {

namespace {

class TokenizerKeyEncoder final : public KeyEncoder {
 public:
  explicit TokenizerKeyEncoder(text::Tokenizer tokenizer) : tokenizer_(std::move(tokenizer)) {}
  std::vector<uint32_t> encode(std::string_view text) const override {
    auto ids = tokenizer_.encode(text, /*add_special_tokens=*/false);
    return {ids.begin(), ids.end()};
  }

 private:
  text::Tokenizer tokenizer_;
};

}  // namespace

std::shared_ptr<const KeyEncoder> make_key_encoder(const std::string& tokenizer_path) {
  if (tokenizer_path.empty()) return std::make_shared<KeyEncoder>();
  return std::make_shared<TokenizerKeyEncoder>(text::Tokenizer::from_file(tokenizer_path));
}

}  // namespace moeserve::router
