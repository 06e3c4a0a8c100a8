#pragma once
// SGLang's native generation endpoint (POST /generate) over the completions pipeline: `text` or `input_ids`
// (one prompt or a batch), `sampling_params` under SGLang's names, `stream`, `return_logprob`. The body
// becomes a completion request (validated by parse_completion_request, so every rule has one message), and
// the answer is written as SGLang writes it: {"text", "output_ids", "meta_info"} (a list of them for a batch
// or n > 1); streamed, `data:` chunks that each carry the text so far, then `data: [DONE]`.

#include <memory>
#include <string_view>

#include "server/encoders.h"
#include "server/openai_request.h"

namespace moeserve::server {

// SGLang's default length (max_new_tokens), where /v1/completions' is OpenAI's 16.
constexpr int kGenerateDefaultMaxNewTokens = 128;

struct GenerateRequest {
  CompletionRequest completion;
  GenerateOptions options;  // how the answer is written (job_spec.h)
};

// Throws ApiError 400 naming the field (sampling_params.X for a sampling parameter); a sampling parameter
// this server does not apply (ebnf, structural_tag, custom_params, or one it does not know) is a 400, since
// ignoring it would change the answer.
GenerateRequest parse_generate_request(std::string_view body);

// The encoder of kGenerate jobs.
std::unique_ptr<ResponseEncoder> make_generate_encoder(const EncoderContext& ctx);

}  // namespace moeserve::server
