#pragma once
// Speculative decoding with the model's own MTP layer (docs/engine.md#speculative-decoding), engine-internal.
//
// Each step, a decoding request with drafts runs [s, d1..dk] (its pending token and k drafted ones) through
// the target in one forward; the engine samples every row in order and keeps the longest prefix where the
// sample equals the draft, plus the first differing (or the k+1-th) sample. Because drafts are greedy
// (one-hot), the standard rejection rule min(1, p/q) is exactly "sample from the target, accept when it
// equals the draft", so the output distribution is the target's, and with the same seed the same tokens come
// out as without drafts.
//
// Rollback: KV rows past the kept prefix are simply overwritten later. The GDN state cannot be truncated, so
// the verify pass copies each position's state into a trail slot (k per live slot, beyond the live and
// snapshot slots) and the kept position's state is copied back: k extra state slots per running request, k
// one-layer state copies per GDN layer and verify plus one slot copy on a rejection, instead of a second
// forward.
//
// The MTP layer keeps a KV cache of its own (one attention layer, same page tables). After every step, the
// Speculator feeds it the step's kept rows (row p = token t_{p+1}, position p, the target's hidden h_p),
// whose last row drafts d1; each further draft is one more MTP row fed the previous row's MTP hidden.

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "storage/kv_cache.h"
#include "vision/multimodal.h"

namespace moeserve {

struct Request;
class ModelRunner;

// Drafts of one verify step at most (SGLang's --speculative-num-draft-tokens is this + 1).
constexpr int kMaxSpeculativeSteps = 8;

// One request's drafting state.
struct DraftState {
  std::vector<int32_t> draft;   // tokens drafted after the pending one, verified next step
  std::vector<int32_t> verify;  // [pending token, draft...]: the verify step's tokens
  double acceptance = 1.0;      // moving average of accepted / drafted
  int pause = 0;                // steps left without drafting (adaptive)
  int pause_len = 0;            // the next pause's length
  // During a step the MTP layer follows (EngineCore::step), the first position the step ran and its first
  // hidden row: a request that finishes in it files its last rows in the prefix cache as FinalRows.
  int64_t followed_from = -1;
  int64_t followed_hidden_row = 0;
};

struct SpeculativeCounters {
  uint64_t drafts = 0;           // verify steps that carried drafts (vllm:spec_decode_num_drafts)
  uint64_t draft_tokens = 0;     // vllm:spec_decode_num_draft_tokens
  uint64_t accepted_tokens = 0;  // vllm:spec_decode_num_accepted_tokens
  std::array<uint64_t, kMaxSpeculativeSteps>
      accepted_per_pos{};     // vllm:spec_decode_num_accepted_tokens_per_pos
  uint64_t paused_steps = 0;  // decode steps the adaptive rule ran without drafting
};

struct SpeculativeOptions {
  int num_steps = 0;     // drafts per verify step (1..kMaxSpeculativeSteps)
  bool adaptive = true;  // pause drafting for a request whose drafts keep failing
  // Benchmark only (bench/, never serve): every draft is accepted whatever the target says, to measure the
  // step cost at a given acceptance length. The output is then not the model's.
  int forced_acceptance = -1;
};

// The rows one step added to a request's caches, for the MTP layer to follow.
struct DraftJob {
  Request* request = nullptr;
  int64_t start = 0;       // first position the step kept
  int64_t rows = 0;        // positions kept: [start, start + rows)
  int64_t hidden_row = 0;  // the first of those positions' rows among the step's hidden rows (the model's)
};

// Rows of a request with images as the MTP layer takes them (engine/request.h: mtp_image_rows, point_at).
struct MtpImageRows {
  std::vector<int32_t> tokens;
  PromptChunk next;        // rows [start + 1, start + rows + 1): their features
  PromptChunk position;    // rows [start, start + rows) inside the prompt: their positions
  bool in_prompt = false;  // else text after the prompt: every axis at cache index + rope_delta
  int64_t rope_delta = 0;
};

// The rows a finishing request's last step kept, for the MTP layer to write too (it drafts nothing after
// them): the request filed them in the prefix cache, and a later hit there must find the MTP rows a cold run
// would have computed. Copies, since the request is gone by then.
struct FinalRows {
  std::vector<int32_t> tokens;  // t_{start+1} .. t_{start+rows}
  int64_t start = 0;
  int64_t hidden_row = 0;               // among the step's hidden rows
  std::vector<int32_t> pages;           // its page table when it finished (the prefix cache holds them now)
  std::optional<MtpImageRows> image{};  // a request with images: the rows as the MTP layer takes them
};

// The speculative-decoding flags as SGLang and vLLM spell them (serve, generate).
struct SpeculativeFlags {
  std::string algorithm{};    // --speculative-algorithm: MTP or NEXTN (any case); empty = off
  int num_steps = -1;         // --speculative-num-steps (-1: unset)
  int eagle_topk = -1;        // --speculative-eagle-topk: only 1 (a chain, no tree)
  int num_draft_tokens = -1;  // --speculative-num-draft-tokens: num_steps + 1 with topk 1
  std::string config_json{};  // vLLM's --speculative-config {"method": "mtp", "num_speculative_tokens": k}
};

// The drafts per verify step the flags ask for (0: speculative decoding off; 3 when only the algorithm is
// given, SGLang's choice for NEXTN). Throws moeserve::Error naming the flag when they are inconsistent or ask
// for what is not supported.
int speculative_steps(const SpeculativeFlags& flags);

class Speculator {
 public:
  // trail_base: the first state slot past the live and snapshot slots; live slot s owns trail slots
  // trail_base + s * num_steps + [0, num_steps).
  // The MTP layer's KV cache stores kv_dtype, as the model's does.
  Speculator(ModelRunner& model, const SpeculativeOptions& options, int page_size, int64_t num_pages,
             DType kv_dtype, int32_t trail_base);

  const SpeculativeOptions& options() const { return options_; }
  KvCache& kv() { return kv_; }

  // Called once per step for each scheduled request: whether its step should return hidden rows (the MTP
  // layer follows it); false while the adaptive rule pauses it, counting the pause down.
  bool follow(Request* r);
  // The trail slots of r's verify step (one per draft).
  std::vector<int32_t> trail_slots(const Request* r) const;
  // After a verify step of `drafted` drafts of which `matched` equalled the target's samples.
  void record(Request* r, int drafted, int matched);
  // Feeds the MTP layer the finished requests' rows and the jobs' rows, then drafts for those requests now
  // decoding, up to `room(r)` drafts each, after reserve(r, tokens) grew r's pages to cover its next verify
  // step (no drafts when it cannot). reserve() runs only after the rows are written: it may evict the
  // finished requests' pages from the prefix cache.
  void draft(std::span<const FinalRows> finals, std::span<const DraftJob> jobs,
             const std::function<int(const Request*)>& room,
             const std::function<bool(Request*, int64_t)>& reserve);

  const SpeculativeCounters& counters() const { return counters_; }

 private:
  ModelRunner& model_;
  SpeculativeOptions options_;
  KvCache kv_;
  int32_t trail_base_;
  SpeculativeCounters counters_;
};

}  // namespace moeserve
