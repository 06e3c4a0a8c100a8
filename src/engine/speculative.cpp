#include "engine/speculative.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "common/bounded_json.h"
#include "common/error.h"
#include "engine/model_runner.h"
#include "engine/request.h"

namespace moeserve {

namespace {

// Adaptive drafting: a request whose moving acceptance (accepted / drafted, weight kAcceptanceWeight for the
// newest verify) falls below kPauseBelow drafts nothing for a pause, then probes again. Pauses double while
// probes keep failing (kFirstPause .. kLongestPause steps), so at acceptance 0 almost every step is a plain
// decode step (which keeps its CUDA graph), and back to kFirstPause once acceptance recovers.
constexpr double kAcceptanceWeight = 0.25;
constexpr double kPauseBelow = 0.3;
constexpr double kRecoveredAbove = 0.5;
constexpr int kFirstPause = 8;
constexpr int kLongestPause = 256;

}  // namespace

int speculative_steps(const SpeculativeFlags& f) {
  constexpr int kDefaultSteps = 3;
  auto in_range = [](int k, const char* flag) {
    check(k >= 1 && k <= kMaxSpeculativeSteps, "{} must be in [1, {}], got {}", flag, kMaxSpeculativeSteps,
          k);
    return k;
  };
  if (!f.config_json.empty()) {
    check(f.algorithm.empty(), "give --speculative-config or --speculative-algorithm, not both");
    nlohmann::json j;
    try {
      j = parse_bounded_json<nlohmann::json>(f.config_json);
    } catch (const std::exception& e) {
      fail("--speculative-config is not valid JSON: {}", e.what());
    }
    check(j.is_object(), "--speculative-config must be a JSON object");
    for (const auto& [key, value] : j.items())
      check(
          key == "method" || key == "num_speculative_tokens",
          "--speculative-config: '{}' is not supported here (only \"method\" and \"num_speculative_tokens\"; "
          "the draft is the checkpoint's own MTP layer)",
          key);
    auto method = j.find("method");
    check(method != j.end() && method->is_string(), "--speculative-config needs \"method\": \"mtp\"");
    const std::string m = method->get<std::string>();
    check(m == "mtp" || m == "qwen3_next_mtp" || m == "qwen3_5_mtp",
          "--speculative-config: method '{}' is not supported (only mtp, the checkpoint's own MTP layer)", m);
    auto k = j.find("num_speculative_tokens");
    check(k != j.end() && k->is_number_integer(), "--speculative-config needs \"num_speculative_tokens\": N");
    const int64_t n = k->get<int64_t>();
    check(n >= 1 && n <= kMaxSpeculativeSteps,
          "--speculative-config: num_speculative_tokens must be in [1, {}], got {}", kMaxSpeculativeSteps, n);
    return int(n);
  }
  if (f.algorithm.empty()) {
    check(f.num_steps < 0 && f.num_draft_tokens < 0 && f.eagle_topk < 0,
          "--speculative-num-steps, --speculative-eagle-topk and --speculative-num-draft-tokens need "
          "--speculative-algorithm MTP (or NEXTN)");
    return 0;
  }
  std::string algorithm = f.algorithm;
  for (char& c : algorithm) c = char(std::toupper(static_cast<unsigned char>(c)));
  check(algorithm == "MTP" || algorithm == "NEXTN",
        "--speculative-algorithm {}: only MTP (NEXTN), the checkpoint's own MTP layer, is supported",
        f.algorithm);
  check(f.eagle_topk < 0 || f.eagle_topk == 1,
        "--speculative-eagle-topk {}: only 1 (a chain of drafts; no draft trees)", f.eagle_topk);
  if (f.num_steps >= 0) {
    const int k = in_range(f.num_steps, "--speculative-num-steps");
    check(f.num_draft_tokens < 0 || f.num_draft_tokens == k + 1,
          "--speculative-num-draft-tokens {} must be --speculative-num-steps + 1 = {} with top-k 1",
          f.num_draft_tokens, k + 1);
    return k;
  }
  if (f.num_draft_tokens >= 0) return in_range(f.num_draft_tokens - 1, "--speculative-num-draft-tokens - 1");
  return kDefaultSteps;
}

KvCacheSpec ModelRunner::mtp_kv_cache_spec(int, int64_t) const {
  fail("this model has no MTP layer");
}

std::vector<int32_t> ModelRunner::mtp_draft(std::span<const SequenceStep>, std::span<const int64_t>, bool,
                                            KvCache&) {
  fail("this model has no MTP layer");
}

std::vector<float> ModelRunner::encode_images(std::span<const ImagePatches* const>) {
  fail("this model has no vision tower");
}

namespace {

KvCacheSpec with_dtype(KvCacheSpec spec, DType dtype) {
  spec.dtype = dtype;
  return spec;
}

}  // namespace

Speculator::Speculator(ModelRunner& model, const SpeculativeOptions& options, int page_size,
                       int64_t num_pages, DType kv_dtype, int32_t trail_base)
    : model_(model),
      options_(options),
      kv_(with_dtype(model.mtp_kv_cache_spec(page_size, num_pages), kv_dtype)),
      trail_base_(trail_base) {
  check(options.num_steps >= 1 && options.num_steps <= kMaxSpeculativeSteps,
        "speculative steps must be in [1, {}], got {}", kMaxSpeculativeSteps, options.num_steps);
  model_.prepare_mtp();
}

bool Speculator::follow(Request* r) {
  DraftState& s = r->spec;
  if (s.pause == 0) return true;
  ++counters_.paused_steps;
  if (--s.pause > 0) return false;
  // The probe: this step's row restarts the MTP cache (the rows of the pause stay stale; drafts only).
  s.acceptance = kPauseBelow;
  return true;
}

std::vector<int32_t> Speculator::trail_slots(const Request* r) const {
  std::vector<int32_t> slots(r->spec.draft.size());
  for (size_t t = 0; t < slots.size(); ++t)
    slots[t] = trail_base_ + r->cache.slot * options_.num_steps + int32_t(t);
  return slots;
}

void Speculator::record(Request* r, int drafted, int matched) {
  if (drafted <= 0) return;
  ++counters_.drafts;
  counters_.draft_tokens += uint64_t(drafted);
  counters_.accepted_tokens += uint64_t(matched);
  for (int i = 0; i < matched; ++i) ++counters_.accepted_per_pos[size_t(i)];
  if (!options_.adaptive) return;
  DraftState& s = r->spec;
  s.acceptance = (1 - kAcceptanceWeight) * s.acceptance + kAcceptanceWeight * double(matched) / drafted;
  if (s.acceptance > kRecoveredAbove) s.pause_len = 0;
  if (s.acceptance < kPauseBelow) {
    s.pause_len = s.pause_len == 0 ? kFirstPause : std::min(2 * s.pause_len, kLongestPause);
    s.pause = s.pause_len;
  }
}

void Speculator::draft(std::span<const FinalRows> finals, std::span<const DraftJob> jobs,
                       const std::function<int(const Request*)>& room,
                       const std::function<bool(Request*, int64_t)>& reserve) {
  if (jobs.empty() && finals.empty()) return;
  std::vector<SequenceStep> steps;
  std::vector<int64_t> hidden_rows;  // each MTP row's hidden row, where the model keeps them
  for (const FinalRows& f : finals) {
    SequenceStep s;
    s.tokens = f.tokens;
    s.start_pos = f.start;
    s.pages = f.pages;
    if (f.image) point_at(*f.image, s);
    steps.push_back(s);
    for (int64_t t = 0; t < int64_t(f.tokens.size()); ++t) hidden_rows.push_back(f.hidden_row + t);
  }
  // The tokens, features and positions the steps of requests with images point to.
  std::vector<MtpImageRows> image_rows(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    const DraftJob& job = jobs[i];
    Request* r = job.request;
    SequenceStep s;
    s.tokens = std::span<const int32_t>(r->tokens.data() + job.start + 1, size_t(job.rows));
    s.start_pos = job.start;
    s.pages = r->cache.pages;
    if (r->mm) {
      image_rows[i] = mtp_image_rows(*r, job.start, job.rows);
      point_at(image_rows[i], s);
    }
    steps.push_back(s);
    for (int64_t t = 0; t < job.rows; ++t) hidden_rows.push_back(job.hidden_row + t);
  }
  std::vector<int32_t> drafts = model_.mtp_draft(steps, hidden_rows, true, kv_);

  std::vector<int> want(jobs.size(), 0);  // drafts each job's request gets this step
  for (size_t i = 0; i < jobs.size(); ++i) {
    Request* r = jobs[i].request;
    r->spec.draft.clear();
    if (r->uncomputed() == 1 && r->spec.pause == 0) {
      const int k = std::min(options_.num_steps, room(r));
      if (k > 0 && reserve(r, r->computed + 1 + k)) want[i] = k;
    }
  }

  // Step j drafts d_{j+1} for every job that wants more than j drafts: its first row was the job's last row;
  // later ones are single rows of the previous draft, fed that row's MTP hidden (output row a of the last
  // step; the first step's rows start with the finished requests').
  std::vector<size_t> active(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) active[i] = i;
  size_t first_row = finals.size();
  for (int j = 0;; ++j) {
    std::vector<size_t> next;
    hidden_rows.clear();
    for (size_t a = 0; a < active.size(); ++a) {
      const size_t i = active[a];
      if (want[i] <= j) continue;
      Request* r = jobs[i].request;
      r->spec.draft.push_back(drafts[first_row + a]);
      if (want[i] > j + 1) {
        next.push_back(i);
        hidden_rows.push_back(int64_t(first_row + a));
      }
    }
    if (next.empty()) break;
    steps.clear();
    for (size_t i : next) {
      Request* r = jobs[i].request;
      SequenceStep s;
      s.tokens = std::span<const int32_t>(&r->spec.draft.back(), 1);
      s.start_pos = r->computed + j;  // draft d_{j+1} follows position computed + j
      s.pages = r->cache.pages;
      if (r->mm) s.rope_delta = r->mm->rope_delta;  // text after the images
      steps.push_back(s);
    }
    drafts = model_.mtp_draft(steps, hidden_rows, false, kv_);
    active = std::move(next);
    first_row = 0;
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    Request* r = jobs[i].request;
    r->spec.verify.clear();
    if (r->spec.draft.empty()) continue;
    r->spec.verify.push_back(r->tokens.back());
    r->spec.verify.insert(r->spec.verify.end(), r->spec.draft.begin(), r->spec.draft.end());
  }
}

}  // namespace moeserve
