// EngineCore: one step = schedule, run the model on the batch, sample, stream, retire.
#include "engine/engine_core.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "backend/backend.h"  // kMaxLogitsTopk
#include "common/error.h"
#include "common/log.h"
#include "engine/capacity.h"
#include "engine/request_limits.h"

namespace moeserve {

namespace {

constexpr int kMaxLogprobs = 20;  // OpenAI's limit for top_logprobs

// A step full of decodes still carries this fraction of the token budget in prefill chunks (1/8: such a
// step runs at most 12.5% over the budget, and waiting prompts keep moving).
constexpr int kMinPrefillShare = 8;

void validate_request(const GenerateRequest& r, int64_t vocab, int64_t max_model_len) {
  const SamplingParams& p = r.params;
  check(!r.id.empty(), "the request id is empty");
  check(!r.prompt.empty(), "request {}: the prompt is empty", r.id);
  // The messages are built only on failure (a prompt is long).
  for (size_t i = 0; i < r.prompt.size(); ++i)
    if (r.prompt[i] < 0 || r.prompt[i] >= vocab)
      fail("request {}: prompt position {}: {}", r.id, i, outside_vocabulary(r.prompt[i], vocab));
  if (p.max_tokens)
    check(*p.max_tokens >= 1, "request {}: max_tokens must be at least 1, got {}", r.id, *p.max_tokens);
  if (auto overflow = context_overflow(int64_t(r.prompt.size()), p.max_tokens, max_model_len))
    fail("request {}: {}", r.id, overflow->message);
  check(std::isfinite(p.temperature) && p.temperature >= 0, "request {}: temperature must be >= 0, got {}",
        r.id, p.temperature);
  check(p.top_p > 0 && p.top_p <= 1, "request {}: top_p must be in (0, 1], got {}", r.id, p.top_p);
  check(p.top_k >= -1, "request {}: top_k must be -1, 0 (off) or positive, got {}", r.id, p.top_k);
  check(p.min_p >= 0 && p.min_p <= 1, "request {}: min_p must be in [0, 1], got {}", r.id, p.min_p);
  check(p.repetition_penalty > 0 && std::isfinite(p.repetition_penalty),
        "request {}: repetition_penalty must be > 0, got {}", r.id, p.repetition_penalty);
  check(std::abs(p.presence_penalty) <= 2, "request {}: presence_penalty must be in [-2, 2], got {}", r.id,
        p.presence_penalty);
  check(std::abs(p.frequency_penalty) <= 2, "request {}: frequency_penalty must be in [-2, 2], got {}", r.id,
        p.frequency_penalty);
  check(p.min_tokens >= 0 && (!p.max_tokens || p.min_tokens <= *p.max_tokens),
        "request {}: min_tokens must be in [0, max_tokens], got {}", r.id, p.min_tokens);
  check(p.top_logprobs >= 0 && p.top_logprobs <= kMaxLogprobs,
        "request {}: top_logprobs must be in [0, {}], got {}", r.id, kMaxLogprobs, p.top_logprobs);
  check(!p.prompt_logprobs || (*p.prompt_logprobs >= 0 && *p.prompt_logprobs <= kMaxLogprobs),
        "request {}: prompt_logprobs must be in [0, {}]", r.id, kMaxLogprobs);
  for (int32_t t : p.stop_token_ids)
    if (t < 0 || t >= vocab) fail("request {}: stop_token_ids: {}", r.id, outside_vocabulary(t, vocab));
  if (p.json)
    check(p.json->schema && p.json->vocab && int64_t(p.json->vocab->bytes.size()) <= vocab &&
              p.json->vocab->usable.size() == p.json->vocab->bytes.size(),
          "request {}: the JSON constraint needs a schema and a token table of at most {} entries", r.id,
          vocab);
  for (auto [t, bias] : p.logit_bias) {
    if (t < 0 || t >= vocab) fail("request {}: logit_bias: {}", r.id, outside_vocabulary(t, vocab));
    check(std::isfinite(bias), "request {}: the logit_bias of token {} is not finite", r.id, t);
  }
}

// The prefix cache's key of row j of an image's run: negative, so never a token id, and 31 bits of the
// image's content hash and grid mixed with j (splitmix64's finaliser), so a different image, or the same one
// resized to another grid (a request's own min/max_pixels), parts from the cached path at its first row (but
// for a 2^-31 chance per row).
int32_t image_cache_key(const PromptImage& image, int64_t j) {
  const ImagePatches& p = image.patches;
  const uint64_t grid = uint64_t(p.grid_t) << 42 ^ uint64_t(p.grid_h) << 21 ^ uint64_t(p.grid_w);
  uint64_t x = image.hash[0] ^ (image.hash[1] + 0x9e3779b97f4a7c15ull * uint64_t(j + 1)) ^
               grid * 0xd6e8feb86659fd93ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return -1 - int32_t(x & 0x7fffffff);
}

}  // namespace

EngineCore::EngineCore(std::unique_ptr<ModelRunner> model, const EngineOptions& options)
    : model_(std::move(model)), options_(options), encoder_cache_(options.encoder_cache_bytes) {
  check(model_ != nullptr, "engine: no model");
  vocab_ = model_->vocab_size();
  if (model_->reduces_logits())
    logit_candidates_ = std::clamp(
        options_.logit_candidates >= 0 ? options_.logit_candidates : model_->default_logit_candidates(), 0,
        kMaxLogitsTopk);
  eos_ = options_.eos_token_ids ? *options_.eos_token_ids : model_->eos_token_ids();
  auto state_spec = [&](int slots) {
    StateCacheSpec spec = model_->state_cache_spec(slots);
    spec.dtype = options_.state_dtype == StateDtype::BF16 ? DType::BF16 : DType::F32;
    return spec;
  };
  auto kv_spec = [&](int page_size, int64_t pages) {
    KvCacheSpec spec = model_->kv_cache_spec(page_size, pages);
    spec.dtype = resolve_kv_cache_dtype(options_.kv_cache_dtype, spec.memory);
    return spec;
  };
  const int spec_steps = options_.speculative_num_steps;
  check(spec_steps >= 0 && spec_steps <= kMaxSpeculativeSteps, "speculative steps must be in [0, {}], got {}",
        kMaxSpeculativeSteps, spec_steps);
  check(
      spec_steps == 0 || model_->has_mtp(),
      "speculative decoding (mtp) needs the checkpoint's MTP layer (mtp.* tensors), which this model lacks");
  // The MTP layer's KV rows live in pages of their own numbered as the model's: one more layer per page.
  KvCacheSpec kv_sizing = kv_spec(options_.page_size, 0);
  if (spec_steps > 0) ++kv_sizing.num_layers;
  capacity_ = size_caches(kv_sizing, state_spec(0), options_, model_->max_position_embeddings(),
                          model_->cache_memory_available());
  const int slots = capacity_.live_slots + capacity_.snapshot_slots;
  cache_ = std::make_unique<CacheManager>(
      kv_spec(capacity_.page_size, capacity_.kv_pages), state_spec(slots + capacity_.live_slots * spec_steps),
      capacity_.live_slots, capacity_.snapshot_slots, options_.enable_prefix_cache);
  if (spec_steps > 0) {
    spec_ = std::make_unique<Speculator>(
        *model_,
        SpeculativeOptions{spec_steps, options_.speculative_adaptive, options_.benchmark_forced_acceptance},
        capacity_.page_size, capacity_.kv_pages, kv_sizing.dtype, slots);
    cache_->add_paged_cache(spec_->kv());
    spdlog::info("speculative decoding: MTP, {} drafts per step{}, {} trail state slots", spec_steps,
                 options_.speculative_adaptive ? " (adaptive)" : "", capacity_.live_slots * spec_steps);
    if (options_.benchmark_forced_acceptance >= 0)
      spdlog::warn(
          "benchmark mode: {} drafts per step accepted whatever the model says; the output is not the "
          "model's",
          options_.benchmark_forced_acceptance);
  }
  SchedulerOptions so;
  so.max_num_batched_tokens = capacity_.max_num_batched_tokens;
  so.min_prefill_tokens = std::max(so.max_num_batched_tokens / kMinPrefillShare, 1);
  so.chunked_prefill_size = capacity_.chunked_prefill_size;
  so.max_running_requests = capacity_.live_slots;
  so.policy = options_.policy;
  scheduler_ = std::make_unique<Scheduler>(*cache_, so);
}

void EngineCore::validate(const GenerateRequest& request) const {
  validate_request(request, vocab_, capacity_.max_model_len);
  if (request.images) layout_images(request);
}

MultimodalPrompt EngineCore::layout_images(const GenerateRequest& request) const {
  const PromptImages& images = *request.images;
  check(model_->has_vision(), "request {}: this model runs without a vision tower: it takes no images",
        request.id);
  check(images.image_token >= 0 && images.image_token < vocab_,
        "request {}: image token {} is outside the vocabulary", request.id, images.image_token);
  const int merge = model_->vision_merge_size();
  std::vector<ImageGrid> grids;
  for (const PromptImage& image : images.images) {
    const ImagePatches& p = image.patches;
    check(p.grid_t == 1 && p.grid_h % merge == 0 && p.grid_w % merge == 0 &&
              int64_t(p.pixel_values.size()) % std::max<int64_t>(p.patches(), 1) == 0,
          "request {}: an image of {}x{}x{} patches does not merge by {}", request.id, p.grid_t, p.grid_h,
          p.grid_w, merge);
    grids.push_back({p.grid_h / merge, p.grid_w / merge});
  }
  try {
    return MultimodalPrompt::make(request.prompt, images.image_token, grids, {}, model_->hidden_size());
  } catch (const Error& e) {
    fail("request {}: {}", request.id, e.what());
  }
}

void EngineCore::add(GenerateRequest request) {
  auto r = std::make_unique<Request>();
  if (request.images) r->mm = layout_images(request);  // before the prompt moves into r
  r->id = std::move(request.id);
  r->tokens = std::move(request.prompt);
  r->prompt_len = int64_t(r->tokens.size());
  r->params = std::move(request.params);
  r->max_tokens = r->params.max_tokens ? *r->params.max_tokens : capacity_.max_model_len - r->prompt_len;
  r->priority = request.priority;
  if (request.snapshot_hint > 0 && request.snapshot_hint < r->prompt_len)
    r->snapshot_hint = request.snapshot_hint;
  r->on_output = std::move(request.on_output);
  r->prompt_logprobs_pending = r->params.prompt_logprobs.has_value();
  r->arrival = next_arrival_++;
  r->sampler.emplace(r->params, r->tokens, r->params.seed ? *r->params.seed : seed_source_());
  if (r->params.json) {
    std::vector<int32_t> end = r->params.ignore_eos ? std::vector<int32_t>{} : eos_;
    end.insert(end.end(), r->params.stop_token_ids.begin(), r->params.stop_token_ids.end());
    r->sampler->constrain(std::move(end));
  }
  if (request.images) {
    // The sampler above saw the image tokens; from here on the rows hold the prefix cache's keys.
    r->images = std::move(request.images);
    size_t row = 0;
    for (const PromptImage& image : r->images->images) {
      const int64_t n = image.patches.tokens(model_->vision_merge_size());
      for (int64_t j = 0; j < n; ++j) r->tokens[size_t(r->mm->image_rows[row++])] = image_cache_key(image, j);
    }
  }
  Request* raw = r.get();
  check(requests_.emplace(raw->id, std::move(r)).second, "a request with id {} is already running", raw->id);
  if (raw->encoded())
    scheduler_->enqueue(raw);
  else
    encoding_.push_back(raw);
}

void EngineCore::encode_images() {
  if (encoding_.empty()) return;
  // This step's images, whole and in each request's order: an image the encoder cache holds, or that an
  // earlier item of this step encodes, takes those features; the others run through the tower in one batch,
  // in arrival order up to the step's patch budget (at least one).
  struct Item {
    Request* owner = nullptr;
    const PromptImage* image = nullptr;
    EncoderCache::Features cached;  // else batch[encoded] encodes it
    size_t encoded = 0;
  };
  std::vector<Item> items;
  std::vector<const ImagePatches*> batch;
  std::vector<const PromptImage*> batch_images;
  int64_t patches = 0;
  for (Request* r : encoding_) {
    for (size_t k = r->images_encoded; k < r->images->images.size(); ++k) {
      const PromptImage& image = r->images->images[k];
      Item item{r, &image, encoder_cache_.find(image), 0};
      if (!item.cached) {
        const EncoderCache::Key key = EncoderCache::key_of(image);
        auto same = std::find_if(batch_images.begin(), batch_images.end(),
                                 [&](const PromptImage* b) { return EncoderCache::key_of(*b) == key; });
        item.encoded = size_t(same - batch_images.begin());
        if (same == batch_images.end()) {
          const ImagePatches& p = image.patches;
          if (!batch.empty() && patches + p.patches() > options_.vision_patches_per_step) break;
          batch.push_back(&p);
          batch_images.push_back(&image);
          patches += p.patches();
        }
      }
      items.push_back(std::move(item));
    }
    if (patches >= options_.vision_patches_per_step) break;
  }
  std::vector<EncoderCache::Features> encoded(batch.size());
  if (!batch.empty()) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<float> features;
    try {
      features = model_->encode_images(batch);
    } catch (const std::exception& e) {
      spdlog::error("engine: vision encoding failed: {}", e.what());
      std::vector<Request*> owners;
      for (const Item& item : items)
        if (std::find(owners.begin(), owners.end(), item.owner) == owners.end()) owners.push_back(item.owner);
      for (Request* r : owners)
        finish(r, FinishReason::Error, false, fmt::format("vision encoding failed: {}", e.what()));
      return;
    }
    counters_.image_encode_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    counters_.images_encoded += batch.size();
    counters_.image_patches_encoded += uint64_t(patches);
    const int64_t per_token = model_->hidden_size();
    size_t offset = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      const size_t n = size_t(batch[i]->tokens(model_->vision_merge_size()) * per_token);
      check(offset + n <= features.size(), "engine: the vision tower returned {} values for more images",
            features.size());
      encoded[i] = std::make_shared<const std::vector<float>>(features.begin() + ptrdiff_t(offset),
                                                              features.begin() + ptrdiff_t(offset + n));
      encoder_cache_.insert(*batch_images[i], encoded[i]);
      offset += n;
    }
  }
  counters_.encoder_cache_misses += batch.size();
  counters_.encoder_cache_hits += items.size() - batch.size();
  for (const Item& item : items) {
    const std::vector<float>& features = item.cached ? *item.cached : *encoded[item.encoded];
    std::vector<float>& into = item.owner->mm->features;
    into.insert(into.end(), features.begin(), features.end());
    ++item.owner->images_encoded;
  }
  for (Request* r : encoding_)
    if (r->encoded()) scheduler_->enqueue(r);
  std::erase_if(encoding_, [](const Request* r) { return r->encoded(); });
}

bool EngineCore::cancel(const std::string& id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  finish(it->second.get(), FinishReason::Abort, true);
  return true;
}

void EngineCore::abort_all() {
  while (!requests_.empty()) finish(requests_.begin()->second.get(), FinishReason::Abort, false);
}

// A sequence's last logits row: the full row, or its candidates with the full row fetched on demand.
struct EngineCore::LogitsRow {
  const ForwardOutput* out = nullptr;
  int64_t vocab = 0;
  const float* full = nullptr;
  const LogitCandidates* candidates = nullptr;
  size_t index = 0;
  std::vector<float> fetched;

  std::span<const float> full_row() {
    if (!full) {
      fetched.resize(size_t(vocab));
      out->fetch_row(index, fetched.data());
      full = fetched.data();
    }
    return {full, size_t(vocab)};
  }
};

void EngineCore::step() {
  encode_images();
  std::vector<ScheduledChunk> plan = scheduler_->schedule();
  if (plan.empty()) {
    // Nothing runs and nothing can be admitted: only a request larger than the whole cache does this, and
    // submit() rejects those. Fail it rather than spin.
    if (scheduler_->running().empty() && !scheduler_->waiting().empty())
      finish(scheduler_->waiting().front(), FinishReason::Error, false,
             "the request does not fit in the KV cache");
    return;
  }

  std::vector<SequenceStep> batch;
  batch.reserve(plan.size());
  std::vector<std::vector<int32_t>> trails(plan.size());
  std::vector<std::vector<int32_t>> model_tokens(plan.size());  // image rows: the image token, not the key
  std::vector<PromptChunk> chunks(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    Request* r = plan[i].request;
    SequenceStep s;
    s.tokens = std::span<const int32_t>(r->tokens.data() + r->computed, size_t(plan[i].tokens));
    s.start_pos = r->computed;
    if (r->mm) {
      // A decode step, or a verify step after the prompt (its pending token and drafts): generated text,
      // after the images.
      const int64_t held = int64_t(r->tokens.size());
      const bool generated_text =
          r->computed >= r->prompt_len && (r->computed + plan[i].tokens == held || verifies(r));
      if (generated_text) {
        s.rope_delta = r->mm->rope_delta;
      } else {
        // A prompt chunk, or a verify step from the prompt's last token (drafts begun as its prefill ended),
        // whose rows past r->tokens are the drafts. An image row takes the image token, not the cache's key.
        for (int64_t j = 0; j < plan[i].tokens; ++j) {
          const int64_t at = r->computed + j;
          model_tokens[i].push_back(at < held ? r->model_token(at) : r->spec.verify[size_t(j)]);
        }
        s.tokens = model_tokens[i];
        chunks[i] = prompt_chunk(*r->mm, r->computed, r->computed + plan[i].tokens);
        chunks[i].apply(s);
      }
    }
    s.pages = r->cache.pages;
    s.state_slot = r->cache.slot;
    s.all_logits = r->prompt_logprobs_pending;
    s.candidates = r->prompt_logprobs_pending ? 0 : logit_candidates_;  // prompt logprobs read whole rows
    if (r->params.temperature > 0) s.temperature = r->params.temperature;
    if (spec_) {
      s.hidden = spec_->follow(r);
      if (verifies(r)) {  // the pending token and the drafts, every row's logits, every position's GDN state
        check(plan[i].tokens == int64_t(r->spec.verify.size()), "engine: request {} verifies {} of {} tokens",
              r->id, plan[i].tokens, r->spec.verify.size());
        if (model_tokens[i].empty()) s.tokens = r->spec.verify;  // else the rows built above, with images
        s.all_logits = true;
        trails[i] = spec_->trail_slots(r);
        s.trail_slots = trails[i];
      }
    }
    batch.push_back(s);
  }
  ForwardOutput out;
  try {
    out = model_->forward(batch, cache_->kv(), cache_->state());
  } catch (const std::exception& e) {
    spdlog::error("engine: forward pass failed: {}", e.what());
    for (const auto& c : plan)
      finish(c.request, FinishReason::Error, false, fmt::format("forward pass failed: {}", e.what()));
    return;
  }
  ++counters_.steps;
  counters_.step_sequences += plan.size();
  for (const auto& c : plan) counters_.step_tokens += uint64_t(c.tokens);
  ++counters_.steps_by_batch[size_t(step_batch_bucket(plan.size()))];

  const float* row = out.logits.data();
  int64_t hidden_row = 0;      // the first hidden row (SequenceStep::hidden) of the next step that asked
  std::vector<DraftJob> jobs;  // what the MTP layer follows after this step
  size_t reduced = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    Request* r = plan[i].request;
    const int64_t tokens = plan[i].tokens;
    const int64_t start = r->computed;
    const bool follow = batch[i].hidden;
    const int64_t step_hidden = hidden_row;
    if (follow) {
      hidden_row += tokens;
      r->spec.followed_from = start;  // until r outlives the step (finish() reads it)
      r->spec.followed_hidden_row = step_hidden;
    }
    const bool candidates = batch[i].candidates > 0;
    if (verifies(r)) {
      std::vector<LogitsRow> rows(static_cast<size_t>(tokens));
      for (auto& v : rows) {
        v.out = &out;
        v.vocab = vocab_;
        if (candidates) {
          check(reduced < out.candidates.size(), "engine: the model returned {} candidate rows for more rows",
                out.candidates.size());
          v.candidates = &out.candidates[reduced];
          v.index = reduced++;
        } else {
          v.full = row;
          row += vocab_;
        }
      }
      const int64_t kept = verify_drafts(r, rows);
      if (kept == 0) continue;  // r finished
      r->spec.followed_from = -1;
      if (follow) jobs.push_back({r, start, kept, step_hidden});
      continue;
    }
    const int64_t rows = candidates ? 0 : r->prompt_logprobs_pending ? tokens : 1;
    if (r->uncomputed() > 1 || r->generated() == 0) counters_.prefill_tokens += uint64_t(tokens);
    std::vector<LogprobEntry> prompt_logprobs;
    if (r->prompt_logprobs_pending) {
      for (int64_t j = 0; j < rows; ++j) {
        int64_t predicted = r->computed + j + 1;  // row j predicts this position
        if (predicted < r->prompt_len)
          r->prompt_logprobs.push_back(
              compute_logprobs({row + j * vocab_, size_t(vocab_)},
                               r->images ? r->model_token(predicted) : r->tokens[size_t(predicted)],
                               *r->params.prompt_logprobs));
      }
    }
    LogitsRow last;
    last.out = &out;
    last.vocab = vocab_;
    if (candidates) {
      check(reduced < out.candidates.size(), "engine: the model returned {} candidate rows for more steps",
            out.candidates.size());
      last.candidates = &out.candidates[reduced];
      last.index = reduced++;
    } else {
      last.full = row + (rows - 1) * vocab_;
    }
    row += rows * vocab_;
    scheduler_->advance(r, tokens);
    bool alive = true;
    if (r->computed == int64_t(r->tokens.size())) {
      if (r->prompt_logprobs_pending) {
        r->prompt_logprobs_pending = false;
        prompt_logprobs = std::move(r->prompt_logprobs);
      }
      alive = sample_and_emit(r, last, std::move(prompt_logprobs));
    }
    if (!alive) continue;
    r->spec.followed_from = -1;
    if (follow) jobs.push_back({r, start, tokens, step_hidden});
  }
  if (!jobs.empty() || !finals_.empty()) draft(jobs);
}

bool EngineCore::verifies(const Request* r) const {
  return spec_ && !r->spec.verify.empty() && r->uncomputed() == 1;
}

std::vector<int32_t> EngineCore::banned_tokens(const Request* r, int64_t generated) const {
  const SamplingParams& p = r->params;
  std::vector<int32_t> banned;
  if (generated < p.min_tokens) {
    if (!p.ignore_eos) banned = eos_;
    banned.insert(banned.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
  }
  return banned;
}

int64_t EngineCore::verify_drafts(Request* r, std::span<LogitsRow> rows) {
  const int64_t T = int64_t(rows.size());
  const SamplingParams& p = r->params;
  const std::vector<int32_t> draft = r->spec.draft;
  const std::vector<int32_t> trail = spec_->trail_slots(r);
  const int k = int(T - 1);
  const int64_t generated = r->generated(), length = int64_t(r->tokens.size());
  GenerateOutput out;
  int matched = 0;
  bool no_token = false;
  // Row i follows the pending token and drafts d_1..d_i. Each row is sampled as a plain decode step would
  // sample it (same sampler, same random stream, from its candidates when they decide the token); the step
  // ends at the first sample that is not the draft.
  for (int64_t i = 0; i < T; ++i) {
    LogitsRow& row = rows[size_t(i)];
    int32_t token = sample(r, row, banned_tokens(r, generated + i));
    if (i < k && i < spec_->options().forced_acceptance) token = draft[size_t(i)];  // benchmark only
    if (token == kNoToken) {
      no_token = true;
      break;
    }
    out.tokens.push_back(token);
    if (p.logprobs) out.logprobs.push_back(logprobs(row, token, p.top_logprobs));
    mark_finish(r, token, generated + i + 1, length + i + 1, out);
    if (out.finished || i == k || token != draft[size_t(i)]) break;
    ++matched;
  }
  spec_->record(r, k, matched);
  r->spec.draft.clear();
  r->spec.verify.clear();

  // The caches keep the pending token and the drafts before the last output token, which is pending next.
  const int64_t kept = int64_t(out.tokens.size());
  if (kept == 0) {
    // The JSON constraint ended the request at the first row; the state already ran past the pending token
    // and cannot go back, so nothing of it is filed in the prefix cache.
    finish(r, r->sampler->constraint_complete() ? FinishReason::Stop : FinishReason::Error, false,
           r->sampler->constraint_complete() ? "" : "no token of the vocabulary continues the JSON output");
    return 0;
  }
  if (kept - 1 < k) cache_->state().copy_slot(trail[size_t(kept - 1)], r->cache.slot);
  r->tokens.insert(r->tokens.end(), out.tokens.begin(), out.tokens.end() - 1);
  scheduler_->advance(r, kept);
  r->tokens.push_back(out.tokens.back());
  counters_.generation_tokens += uint64_t(kept);
  if (no_token) {
    out.finished = true;
    out.finish_reason = r->sampler->constraint_complete() ? FinishReason::Stop : FinishReason::Error;
    if (out.finish_reason == FinishReason::Error)
      out.error = "no token of the vocabulary continues the JSON output";
  }
  if (out.finished) {
    finish(r, std::move(out), true);
    return 0;
  }
  emit(r, std::move(out));
  return kept;
}

void EngineCore::draft(std::span<const DraftJob> jobs) {
  auto room = [&](const Request* r) {
    return int(std::min(r->max_tokens - r->generated(), capacity_.max_model_len - int64_t(r->tokens.size())) -
               1);
  };
  auto reserve = [&](Request* r, int64_t tokens) { return cache_->reserve(r->cache, tokens); };
  std::vector<FinalRows> finals = std::move(finals_);
  finals_.clear();
  const auto start = std::chrono::steady_clock::now();
  try {
    spec_->draft(finals, jobs, room, reserve);
    counters_.spec_draft_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } catch (const std::exception& e) {
    // Drafts only ever save time: without them every request decodes plainly.
    spdlog::error("engine: MTP drafting failed: {}", e.what());
    for (const auto& job : jobs) {
      job.request->spec.draft.clear();
      job.request->spec.verify.clear();
    }
  }
}

int32_t EngineCore::sample(Request* r, LogitsRow& row, std::span<const int32_t> banned) {
  std::optional<int32_t> from_candidates;
  if (row.candidates) from_candidates = r->sampler->sample(*row.candidates, banned);
  if (row.candidates && !from_candidates) ++counters_.sampled_from_full_rows;
  return from_candidates ? *from_candidates : r->sampler->sample(row.full_row(), banned);
}

LogprobEntry EngineCore::logprobs(LogitsRow& row, int32_t token, int top_n) {
  std::optional<LogprobEntry> e;
  if (!row.full) e = compute_logprobs(*row.candidates, token, top_n);
  return e ? std::move(*e) : compute_logprobs(row.full_row(), token, top_n);
}

bool EngineCore::sample_and_emit(Request* r, LogitsRow& row, std::vector<LogprobEntry> prompt_logprobs) {
  const SamplingParams& p = r->params;
  const int32_t token = sample(r, row, banned_tokens(r, r->generated()));
  if (token == kNoToken) {  // the JSON constraint leaves nothing: a complete document stops here
    if (r->sampler->constraint_complete()) {
      GenerateOutput out;
      out.finished = true;
      out.finish_reason = FinishReason::Stop;
      finish(r, std::move(out), true);
    } else {
      finish(r, FinishReason::Error, true, "no token of the vocabulary continues the JSON output");
    }
    return false;
  }
  r->tokens.push_back(token);
  ++counters_.generation_tokens;

  GenerateOutput out;
  out.tokens = {token};
  if (p.logprobs) out.logprobs.push_back(logprobs(row, token, p.top_logprobs));
  out.prompt_logprobs = std::move(prompt_logprobs);
  mark_finish(r, token, r->generated(), int64_t(r->tokens.size()), out);
  if (out.finished) {
    finish(r, std::move(out), true);
    return false;
  }
  emit(r, std::move(out));
  return true;
}

void EngineCore::mark_finish(const Request* r, int32_t token, int64_t generated, int64_t length,
                             GenerateOutput& out) const {
  const SamplingParams& p = r->params;
  const bool is_eos = !p.ignore_eos && std::find(eos_.begin(), eos_.end(), token) != eos_.end();
  const bool is_stop =
      std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end();
  if (is_eos || is_stop) {
    out.finished = true;
    out.finish_reason = FinishReason::Stop;
    out.stop_token = token;
  } else if (generated >= r->max_tokens || length >= capacity_.max_model_len) {
    out.finished = true;
    out.finish_reason = FinishReason::Length;
  }
}

void EngineCore::emit(Request* r, GenerateOutput out) {
  out.request_id = r->id;
  out.usage.prompt_tokens = r->prompt_len;
  out.usage.completion_tokens = r->generated();
  out.usage.cached_tokens = std::max<int64_t>(r->cached_tokens, 0);
  if (r->on_output) outbox_.emplace_back(r->on_output, std::move(out));
}

void EngineCore::deliver() {
  auto events = std::move(outbox_);
  outbox_.clear();
  for (auto& [callback, event] : events) {
    try {
      callback(event);
    } catch (const std::exception& e) {
      spdlog::warn("engine: output callback of request {} threw: {}", event.request_id, e.what());
    }
  }
}

void EngineCore::finish(Request* r, FinishReason reason, bool keep, std::string error) {
  GenerateOutput out;
  out.finished = true;
  out.finish_reason = reason;
  out.error = std::move(error);
  finish(r, std::move(out), keep);
}

void EngineCore::finish(Request* r, GenerateOutput final_event, bool keep) {
  std::erase(encoding_, r);
  // Finishing in a step the MTP layer follows: the rows it kept (up to the last token it computed) are filed
  // in the prefix cache below, so the MTP layer writes its rows of them too (step() runs it after the loop).
  const int64_t from = r->spec.followed_from;
  if (spec_ && keep && cache_->prefix_cache_enabled() && from >= 0 && r->computed > from &&
      int64_t(r->tokens.size()) > r->computed) {
    FinalRows& f = finals_.emplace_back(
        FinalRows{std::vector<int32_t>(r->tokens.begin() + from + 1, r->tokens.begin() + r->computed + 1),
                  from, r->spec.followed_hidden_row, r->cache.pages});
    if (r->mm) f.image = mtp_image_rows(*r, from, r->computed - from);
  }
  scheduler_->remove(r, keep);
  ++counters_.requests_finished;
  if (final_event.finish_reason == FinishReason::Abort) ++counters_.requests_aborted;
  // The id is free again before the client sees the end of its stream, so it may reuse it at once.
  const std::string id = r->id;
  if (on_retired_) on_retired_(id);
  emit(r, std::move(final_event));
  requests_.erase(id);  // r dies here
}

EngineStats EngineCore::stats() const {
  EngineStats s = counters_;
  s.running = int(scheduler_->running().size());
  s.queued = int(scheduler_->waiting().size() + encoding_.size());
  s.kv_pages_total = cache_->pages_total();
  s.kv_pages_used = cache_->pages_in_sequences();
  s.kv_pages_cached = cache_->pages_cached_only();
  s.kv_pages_free = cache_->pages_free();
  s.kv_tokens_total = capacity_.kv_tokens;
  s.kv_bytes_per_token = cache_->kv().spec().bytes_per_token();
  s.kv_dtype = kv_cache_dtype_name(capacity_.kv_dtype);
  s.live_slots_total = cache_->slots().live_total();
  s.max_num_batched_tokens = capacity_.max_num_batched_tokens;
  s.live_slots_used = cache_->slots().live_used();
  s.snapshot_slots_total = cache_->slots().snapshot_total();
  s.snapshot_slots_used = cache_->slots().snapshot_used();
  s.prefix_cache_queries = scheduler_->counters().prefix_cache_queries;
  s.prefix_cache_hits = scheduler_->counters().prefix_cache_hits;
  s.preemptions = scheduler_->counters().preemptions;
  s.prompt_tokens = s.prefix_cache_queries;
  s.encoder_cache_bytes = int64_t(encoder_cache_.bytes());
  if (spec_) {
    const SpeculativeCounters& c = spec_->counters();
    s.spec_drafts = c.drafts;
    s.spec_draft_tokens = c.draft_tokens;
    s.spec_accepted_tokens = c.accepted_tokens;
    s.spec_accepted_per_pos.assign(c.accepted_per_pos.begin(),
                                   c.accepted_per_pos.begin() + options_.speculative_num_steps);
  }
  return s;
}

void EngineCore::check_invariants() const {
  std::vector<const CacheSeq*> running;
  for (const Request* r : scheduler_->running()) {
    check(r->running, "engine: request {} is in the running list but not marked running", r->id);
    check(r->computed >= r->cache.cached && r->computed < int64_t(r->tokens.size()),
          "engine: request {} computed {} of {} tokens (cached {})", r->id, r->computed, r->tokens.size(),
          r->cache.cached);
    check(int64_t(r->cache.pages.size()) * capacity_.page_size >= r->computed,
          "engine: request {} computed {} tokens but holds {} pages", r->id, r->computed,
          r->cache.pages.size());
    running.push_back(&r->cache);
  }
  for (const Request* r : scheduler_->waiting())
    check(!r->running && !r->cache.active() && r->computed == 0,
          "engine: waiting request {} holds cache state", r->id);
  for (const Request* r : encoding_)
    check(!r->running && !r->cache.active() && !r->encoded(),
          "engine: request {} waits for its images but "
          "holds cache state or has them all",
          r->id);
  check(scheduler_->running().size() + scheduler_->waiting().size() + encoding_.size() == requests_.size(),
        "engine: {} running + {} waiting + {} encoding images, but {} live requests",
        scheduler_->running().size(), scheduler_->waiting().size(), encoding_.size(), requests_.size());
  cache_->check_invariants(running);
}

}  // namespace moeserve
