#pragma once
// SGLang's native POST /generate body: `text` or `input_ids` (one prompt or a batch), `sampling_params` under
// SGLang's names (one object, or a list of one per prompt), `stream`, `return_logprob`. It becomes a
// completion request, or one per prompt (validated by
// parse_completion_request, so every rule has one message) and the options of how the answer is written
// (generate_api.h writes it). Kept apart from the encoder so that the fuzz target reaches it alone.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "server/openai_request.h"

namespace moeserve::server {

// SGLang's /generate: how its answer is written.
struct GenerateOptions {
  bool batch = false;              // the prompt was a list: the answer is a list, even of one
  bool logprobs = false;           // return_logprob
  bool text_in_logprobs = false;   // return_text_in_logprobs: each logprob entry carries its token's text
  int64_t logprob_start_len = -1;  // >= 0: the prompt's logprobs from this position on
  std::string rid;                 // the client's request id (meta_info.id); "": the job's id
  // --incremental-streaming-output (SGLang's server flag): each streamed chunk carries its new text, ids and
  // output logprobs only, where by default it carries everything so far.
  bool incremental = false;
};

// SGLang's default length (max_new_tokens), where /v1/completions' is OpenAI's 16.
constexpr int kGenerateDefaultMaxNewTokens = 128;

struct SglangGenerateRequest {
  CompletionRequest completion;  // every prompt, when per_prompt is empty
  // sampling_params as a list: one request per prompt of the batch, in order, each with its prompt and
  // sampling (stream and logprobs are the body's, n the same for all).
  std::vector<CompletionRequest> per_prompt;
  GenerateOptions options;  // how the answer is written
};

// Throws ApiError 400 naming the field (sampling_params.X for a sampling parameter); a sampling parameter
// this server does not apply (ebnf, structural_tag, custom_params, or one it does not know) is a 400, since
// ignoring it would change the answer.
SglangGenerateRequest parse_generate_request(std::string_view body);

}  // namespace moeserve::server
