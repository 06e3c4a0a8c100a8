#pragma once
// SGLang's native generation endpoint (POST /generate) over the completions pipeline; its body is parsed by
// generate_request.h. The answer is written as SGLang writes it: {"text", "output_ids", "meta_info"} (a list
// of them for a batch or n > 1); streamed, `data:` chunks that each carry the text so far, then `data:
// [DONE]`.

#include <memory>
#include <string_view>

#include "server/encoders.h"

namespace moeserve::server {

// The encoder of kGenerate jobs.
std::unique_ptr<ResponseEncoder> make_generate_encoder(const EncoderContext& ctx);

}  // namespace moeserve::server
