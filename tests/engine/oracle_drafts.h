#pragma once
// OracleDrafts: a model runner whose MTP drafts come from an oracle where it knows the continuation, for the
// speculative-decoding suites (tests/engine/speculative_test.cpp on the CPU, tests/backend/cuda/
// cuda_speculative_test.cpp on the GPU). The fixtures' random-weight MTP layers are almost always wrong; the
// oracle makes drafts accepted at every length, so each rollback depth is taken. It also logs every verify
// step the engine runs, so a suite can compare the drafts of two runs.

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "forwarding_runner.h"

namespace moeserve::engine_test {

class OracleDrafts : public ForwardingRunner {
 public:
  // The draft after (position, token) is the token that followed it in the sequences learn() was shown,
  // except at a position that is a multiple of miss_every (then that token + 1, a wrong draft) or of
  // own_every (0: none; then the MTP layer's own draft stands). Elsewhere the MTP layer's draft stands.
  OracleDrafts(std::unique_ptr<ModelRunner> inner, int miss_every, int own_every = 0)
      : ForwardingRunner(std::move(inner)), miss_(miss_every), own_(own_every) {}
  void learn(const std::vector<int32_t>& sequence) {
    for (size_t i = 0; i + 1 < sequence.size(); ++i) next_[{int64_t(i), sequence[i]}] = sequence[i + 1];
  }
  // Every verify step the engine ran: its first position, then its tokens (the pending one and the drafts).
  using Log = std::shared_ptr<std::vector<std::vector<int32_t>>>;
  Log verified() const { return verified_; }

  ForwardOutput forward(std::span<const SequenceStep> batch, KvCache& kv, StateCache& state) override {
    for (const SequenceStep& s : batch) {
      if (s.trail_slots.empty()) continue;
      std::vector<int32_t> step{int32_t(s.start_pos)};
      step.insert(step.end(), s.tokens.begin(), s.tokens.end());
      verified_->push_back(std::move(step));
    }
    return ForwardingRunner::forward(batch, kv, state);
  }
  std::vector<int32_t> mtp_draft(std::span<const SequenceStep> batch, std::span<const int64_t> hidden_rows,
                                 bool from_forward, KvCache& kv) override {
    // The MTP layer runs whatever the oracle says: it writes its KV rows, and chained steps feed on its
    // hidden.
    std::vector<int32_t> drafts = ForwardingRunner::mtp_draft(batch, hidden_rows, from_forward, kv);
    for (size_t i = 0; i < batch.size(); ++i) {
      // The step's last row: token t_{p+1} at position p drafts t_{p+2}.
      const int64_t position = batch[i].start_pos + int64_t(batch[i].tokens.size());
      auto it = next_.find({position, batch[i].tokens.back()});
      if (it == next_.end() || (own_ > 0 && position % own_ == 0)) continue;
      drafts[i] = position % miss_ == 0 ? (it->second + 1) % int32_t(vocab_size()) : it->second;
    }
    return drafts;
  }

 private:
  int miss_, own_;
  std::map<std::pair<int64_t, int32_t>, int32_t> next_;
  Log verified_ = std::make_shared<std::vector<std::vector<int32_t>>>();
};

}  // namespace moeserve::engine_test
