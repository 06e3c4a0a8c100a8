#pragma once
// A Hugging Face `tokenizer.json` tokenizer: normalizer, pre-tokenizer, BPE model, added tokens,
// post-processor and decoder, producing the same ids and text as the `tokenizers` library for the components
// it supports (the byte-level BPE of the Qwen, Llama-3 and DeepSeek families, and the byte-fallback BPE of
// Llama-2 / Mistral style files). Unsupported components are
// load errors that name them. A Tokenizer is immutable after loading, cheap to copy and safe to share between
// threads.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::text {

class Tokenizer {
 public:
  // Throws moeserve::Error naming the file and the offending field when the file is missing, is not
  // JSON, or uses a component this implementation does not have.
  static Tokenizer from_file(const std::string& path);
  static Tokenizer from_json(std::string_view json_text, const std::string& origin = "tokenizer.json");

  // add_special_tokens applies the post-processor (e.g. Llama-3's BOS); Qwen's adds nothing. Input that is
  // not valid UTF-8 is encoded as if each ill-formed sequence were U+FFFD.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;

  // Encodes every text on the process-wide thread pool; the result is in input order.
  std::vector<std::vector<int32_t>> encode_batch(std::span<const std::string> texts,
                                                 bool add_special_tokens = true) const;

  // Ill-formed byte sequences (e.g. a lone piece of a multi-byte character) become U+FFFD, as in HF.
  // Negative ids are an error; ids past the tokenizer (embedding padding) decode to nothing, as in HF.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The raw bytes one token contributes to decoded text (after the ByteLevel decoder): the unit the
  // streaming detokenizer works with. Ids past the tokenizer (the padding of the embedding table) have none.
  const std::string& token_bytes(int32_t id) const;

  // Id of a vocabulary entry or added token by its exact text (e.g. "<|im_end|>"), if any.
  std::optional<int32_t> token_id(std::string_view token) const;
  // The vocabulary string of an id (byte-level form, e.g. "Ġhello"), or nullopt.
  std::optional<std::string> id_to_token(int32_t id) const;

  bool is_special(int32_t id) const;  // an added token marked "special": true
  bool is_added(int32_t id) const;    // any added token (special or not)
  size_t vocab_size() const;          // 1 + the largest id (model vocabulary and added tokens)

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace moeserve::text
