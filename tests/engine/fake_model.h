#pragma once
// FakeModel: a ModelRunner whose next-token logits are a pseudo-random function of the whole prefix, computed
// the way a hybrid model must: each position's token and position go into its KV page row, and a running hash
// of the tokens lives in the GDN state slot. Every step re-reads the prefix through the page table and checks
// it against the state, so a wrong page, a stale or misplaced snapshot, or a bad start_pos throws instead of
// quietly producing tokens. expected_greedy() gives the answer without any cache.

#include <cstdint>
#include <span>
#include <vector>

#include "common/error.h"
#include "engine/model_runner.h"

namespace moeserve::fake {

class FakeModel : public ModelRunner {
 public:
  explicit FakeModel(int64_t vocab = 32, std::vector<int32_t> eos = {0}, int64_t max_len = 4096)
      : vocab_(vocab), eos_(std::move(eos)), max_len_(max_len) {}

  static uint64_t mix(uint64_t x) {  // splitmix64 finaliser
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }
  static float hash_step(float h, int32_t token) { return float((int64_t(h) * 31 + token + 1) % 1000003); }
  static float hash_of(std::span<const int32_t> tokens) {
    float h = 7;
    for (int32_t t : tokens) h = hash_step(h, t);
    return h;
  }
  void logits_of(float h, float* out) const {
    for (int64_t v = 0; v < vocab_; ++v)
      out[v] = float(mix(uint64_t(h) * 1315423911ull + uint64_t(v)) % 6001) / 1000.0f - 3.0f;
  }
  std::vector<float> logits_after(std::span<const int32_t> prefix) const {
    std::vector<float> l(static_cast<size_t>(vocab_));
    logits_of(hash_of(prefix), l.data());
    return l;
  }
  // Greedy continuation of prompt, n tokens (no eos handling).
  std::vector<int32_t> expected_greedy(std::vector<int32_t> tokens, int n) const {
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) {
      auto l = logits_after(tokens);
      int32_t best = 0;
      for (int32_t v = 1; v < vocab_; ++v)
        if (l[size_t(v)] > l[size_t(best)]) best = v;
      out.push_back(best);
      tokens.push_back(best);
    }
    return out;
  }

  int64_t vocab_size() const override { return vocab_; }
  int64_t max_position_embeddings() const override { return max_len_; }
  std::vector<int32_t> eos_token_ids() const override { return eos_; }
  KvCacheSpec kv_cache_spec(int page_size, int64_t num_pages) const override {
    return {1, 1, 2, page_size, num_pages};
  }
  StateCacheSpec state_cache_spec(int num_slots) const override { return {1, 2, 2, 1, 1, 1, num_slots}; }

  ForwardOutput forward(std::span<const SequenceStep> batch, KvCache& kv, StateCache& state) override {
    ForwardOutput out;
    auto& record = steps_log.emplace_back();
    for (const auto& s : batch) record.push_back(int64_t(s.tokens.size()));
    const int ps = kv.spec().page_size;
    auto row = [&](std::span<const int32_t> pages, int64_t pos) {
      check(pos / ps < int64_t(pages.size()), "fake model: position {} beyond the page table", pos);
      return kv.keys(0, pages[size_t(pos / ps)]) + (pos % ps) * 2;
    };
    for (const auto& s : batch) {
      float* st = state.conv(0, s.state_slot);  // [0] tokens seen, [1] hash
      if (s.start_pos == 0) {
        st[0] = 0;
        st[1] = 7;
      }
      check(st[0] == float(s.start_pos), "fake model: state holds {} tokens, step starts at {}", st[0],
            s.start_pos);
      float h = 7;
      for (int64_t p = 0; p < s.start_pos; ++p) {
        const float* r = row(s.pages, p);
        check(r[1] == float(p), "fake model: position {} reads the row of position {}", p, r[1]);
        h = hash_step(h, int32_t(r[0]));
      }
      check(h == st[1], "fake model: the state does not match the cached tokens at {} (stale snapshot?)",
            s.start_pos);
      for (size_t i = 0; i < s.tokens.size(); ++i) {
        int64_t p = s.start_pos + int64_t(i);
        float* r = row(s.pages, p);
        r[0] = float(s.tokens[i]);
        r[1] = float(p);
        h = hash_step(h, s.tokens[i]);
        if (s.all_logits || i + 1 == s.tokens.size()) {
          out.logits.resize(out.logits.size() + size_t(vocab_));
          logits_of(h, out.logits.data() + out.logits.size() - size_t(vocab_));
          ++out.rows;
        }
      }
      st[0] = float(s.start_pos + int64_t(s.tokens.size()));
      st[1] = h;
    }
    ++steps;
    return out;
  }

  int64_t steps = 0;
  std::vector<std::vector<int64_t>> steps_log;  // per forward pass: each sequence's token count, batch order

 private:
  int64_t vocab_;
  std::vector<int32_t> eos_;
  int64_t max_len_;
};

}  // namespace moeserve::fake
