#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace moeserve {

namespace sampling {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Candidate {
  float logit;
  int32_t token;
};

bool higher(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.token < b.token);
}

// A row's tokens in sampling order, made available lazily.
class RowView {
 public:
  virtual ~RowView() = default;
  virtual size_t vocab() const = 0;
  // Whether at(0) .. at(n - 1) are available (n ≤ vocab()); false: only the full row could say.
  virtual bool ensure(size_t n) = 0;
  virtual const Candidate& at(size_t i) const = 0;
  // Σ over the whole row of exp(double(l - max) * inv_t), in column order; nullopt if unknown.
  virtual std::optional<double> total_weight(double inv_t) = 0;
  // The whole row by token id; empty when only the leading candidates are known.
  virtual std::span<const float> columns() const { return {}; }
};

// A full row: sorts only as far as asked (the mass almost always lies in the first few hundred tokens).
class FullRow final : public RowView {
 public:
  explicit FullRow(std::span<const float> logits) : logits_(logits) {}
  size_t vocab() const override { return logits_.size(); }
  bool ensure(size_t n) override {
    if (n <= sorted_) return true;
    const size_t V = logits_.size();
    if (n == 1) {  // the argmax alone: one pass, nothing sorted yet
      size_t best = 0;
      for (size_t i = 1; i < V; ++i)
        if (logits_[i] > logits_[best]) best = i;
      order_.assign(1, {logits_[best], int32_t(best)});
      sorted_ = 1;
      return true;
    }
    if (order_.size() < V) {  // every token, then sort a prefix of kProbe or twice the last one
      order_.resize(V);
      for (size_t i = 0; i < V; ++i) order_[i] = {logits_[i], int32_t(i)};
      sorted_ = 0;
    }
    const size_t target = std::min(V, std::max({n, kProbe, 2 * sorted_}));
    auto first = order_.begin() + int64_t(sorted_), mid = order_.begin() + int64_t(target);
    if (target < V) std::nth_element(first, mid, order_.end(), higher);
    std::sort(first, mid, higher);
    sorted_ = target;
    return true;
  }
  const Candidate& at(size_t i) const override { return order_[i]; }
  std::span<const float> columns() const override { return logits_; }
  std::optional<double> total_weight(double inv_t) override {
    ensure(1);
    const float max = order_[0].logit;
    double z = 0;
    for (float l : logits_) z += std::exp(double(l - max) * inv_t);
    return z;
  }

 private:
  static constexpr size_t kProbe = 1024;
  std::span<const float> logits_;
  std::vector<Candidate> order_;
  size_t sorted_ = 0;
};

// A row's leading candidates (not the whole row). Banned candidates go to -inf and to the back; the tokens
// behind them are unknown, so only the candidates before them are available.
class CandidateRow final : public RowView {
 public:
  CandidateRow(const LogitCandidates& c, std::span<const int32_t> banned) : c_(c), order_(c.tokens.size()) {
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = {c.logits[i], c.tokens[i]};
    size_t hits = 0;
    for (auto& e : order_)
      if (std::find(banned.begin(), banned.end(), e.token) != banned.end()) e.logit = kNegInf, ++hits;
    if (hits) std::stable_sort(order_.begin(), order_.end(), higher);
    available_ = order_.size() - hits;
    mass_known_ = banned.empty();
  }
  size_t vocab() const override { return size_t(c_.vocab); }
  bool ensure(size_t n) override { return n <= available_; }
  const Candidate& at(size_t i) const override { return order_[i]; }
  std::optional<double> total_weight(double inv_t) override {
    (void)inv_t;  // the row's sums were taken at this request's temperature
    if (!mass_known_) return std::nullopt;
    return c_.sum_exp_t;
  }

 private:
  const LogitCandidates& c_;
  std::vector<Candidate> order_;
  size_t available_ = 0;
  bool mass_known_ = false;
};

}  // namespace sampling

using sampling::kNegInf;
using sampling::RowView;

// What the cuts keep: the first n tokens of the sampling order, weights relative to `max`, summing to total.
struct Sampler::Cut {
  size_t n = 0;
  float max = 0;
  double inv_t = 1;
  double total = 0;
  double weight(const RowView& row, size_t i) const {
    return std::exp(double(row.at(i).logit - max) * inv_t);
  }
};

Sampler::Sampler(const SamplingParams& params, std::span<const int32_t> prompt, uint64_t seed)
    : params_(params), rng_(seed) {
  if (params_.repetition_penalty != 1.0f) seen_.insert(prompt.begin(), prompt.end());
}

bool Sampler::has_penalties() const {
  return params_.repetition_penalty != 1.0f || params_.frequency_penalty != 0.0f ||
         params_.presence_penalty != 0.0f || !params_.logit_bias.empty();
}

void Sampler::apply_penalties(std::span<float> logits) const {
  const float rep = params_.repetition_penalty;
  if (rep != 1.0f) {
    for (int32_t t : seen_) {
      float& l = logits[size_t(t)];
      l = l > 0 ? l / rep : l * rep;
    }
  }
  if (params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f) {
    for (auto [t, count] : generated_)
      logits[size_t(t)] -= params_.frequency_penalty * float(count) + params_.presence_penalty;
  }
  for (auto [t, bias] : params_.logit_bias) logits[size_t(t)] += bias;
}

void Sampler::constrain(std::vector<int32_t> end_tokens) {
  if (!params_.json) return;
  matcher_.emplace(params_.json->schema);
  constraint_active_ = !params_.json->start_after_token;
  end_tokens_ = std::move(end_tokens);
  first_byte_ok_.fill(-1);
}

bool Sampler::constraint_complete() const { return constraint_active_ && matcher_->can_end(); }

bool Sampler::allowed(int32_t token) {
  if (std::find(end_tokens_.begin(), end_tokens_.end(), token) != end_tokens_.end()) return matcher_->can_end();
  const TokenBytes& vocab = *params_.json->vocab;
  if (size_t(token) >= vocab.bytes.size()) return false;
  if (!vocab.usable[size_t(token)]) {
    const std::vector<int32_t>& control = params_.json->control_tokens;
    if (std::find(control.begin(), control.end(), token) == control.end()) return false;
    return matcher_->accepts(vocab.bytes[size_t(token)]);
  }
  const std::string& bytes = vocab.bytes[size_t(token)];
  // Most tokens fail on their first byte (at a structural position, nearly all): one check per byte value.
  int8_t& first = first_byte_ok_[uint8_t(bytes[0])];
  if (first < 0) first = matcher_->accepts(std::string_view(bytes.data(), 1));
  return first && (bytes.size() == 1 || matcher_->accepts(bytes));
}

double Sampler::next_uniform() {
  if (next_u_ == pending_u_.size()) pending_u_.push_back(uniform());
  return pending_u_[next_u_++];
}

std::optional<int32_t> Sampler::choose_constrained(RowView& row) {
  // The first accepted token in sampling order (banned ones at -inf never), kNoToken if none.
  auto first_allowed = [&]() -> std::optional<int32_t> {
    for (size_t i = 0; i < row.vocab(); ++i) {
      if (!row.ensure(i + 1)) return std::nullopt;
      if (row.at(i).logit == kNegInf) break;
      if (allowed(row.at(i).token)) return row.at(i).token;
    }
    return kNoToken;
  };
  if (params_.temperature <= 0.0f || params_.top_k == 1) return first_allowed();
  std::optional<Cut> c = cut(row);
  if (!c) return std::nullopt;
  // Rejection: draw from what is left of the cut; a rejected token leaves it.
  std::vector<size_t> rejected;  // positions in the order
  double left = c->total;
  for (int attempt = 0; attempt < kMaxRejections && left > 0; ++attempt) {
    const double target = next_uniform() * left;
    double acc = 0;
    std::optional<size_t> pick;
    for (size_t i = 0; i < c->n; ++i) {
      if (!row.ensure(i + 1)) return std::nullopt;
      if (std::find(rejected.begin(), rejected.end(), i) != rejected.end()) continue;
      const double w = c->weight(row, i);
      if (!(w > 0)) break;
      acc += w;
      pick = i;
      if (target < acc) break;
    }
    if (!pick) break;
    if (allowed(row.at(*pick).token)) return row.at(*pick).token;
    rejected.push_back(*pick);
    left -= c->weight(row, *pick);
    if (*pick >= kDeepDraw) break;  // a flat distribution: each draw walks far, one scan is cheaper
  }
  // Many rejections: the restricted distribution directly, every token of the cut checked (by token id when
  // the cut is the whole row, which spares sorting it).
  std::vector<std::pair<int32_t, double>> valid;
  double mass = 0;
  auto consider = [&](int32_t token, double w) {
    if (!(w > 0) || !allowed(token)) return;
    valid.emplace_back(token, w);
    mass += w;
  };
  const std::span<const float> columns = row.columns();
  if (c->n == row.vocab() && !columns.empty()) {
    for (size_t t = 0; t < columns.size(); ++t)
      consider(int32_t(t), std::exp(double(columns[t] - c->max) * c->inv_t));
  } else {
    for (size_t i = 0; i < c->n; ++i) {
      if (!row.ensure(i + 1)) return std::nullopt;
      consider(row.at(i).token, c->weight(row, i));
    }
  }
  // Nothing valid in the cut (or only tokens whose weight underflowed): the most likely valid token.
  if (valid.empty()) return first_allowed();
  const double target = next_uniform() * mass;
  double acc = 0;
  for (auto [token, w] : valid) {
    acc += w;
    if (target < acc) return token;
  }
  return valid.back().first;
}

void Sampler::accept(int32_t token) {
  if (matcher_) {
    const bool end = std::find(end_tokens_.begin(), end_tokens_.end(), token) != end_tokens_.end();
    if (constraint_active_ && !end) matcher_->advance(params_.json->vocab->bytes[size_t(token)]);
    first_byte_ok_.fill(-1);
    if (!constraint_active_ && token == params_.json->start_after_token) constraint_active_ = true;
  }
  if (params_.repetition_penalty != 1.0f) seen_.insert(token);
  if (params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f) ++generated_[token];
}

double Sampler::uniform() {
  return double(rng_() >> 11) * 0x1.0p-53;
}

// The logits the cuts see: penalties applied and banned tokens at -inf (unless that bans everything).
std::span<const float> Sampler::prepare(std::span<const float> raw, std::span<const int32_t> banned) {
  bool need_copy = has_penalties();
  for (int32_t t : banned) need_copy |= raw[size_t(t)] != kNegInf;
  if (!need_copy) return raw;
  scratch_.assign(raw.begin(), raw.end());
  apply_penalties(scratch_);
  std::vector<float> saved;
  for (int32_t t : banned) {
    saved.push_back(scratch_[size_t(t)]);
    scratch_[size_t(t)] = kNegInf;
  }
  bool all_banned = true;
  for (float l : scratch_) all_banned &= l == kNegInf;
  if (all_banned)  // nothing else is possible: ignore the ban rather than divide by zero
    for (size_t i = 0; i < banned.size(); ++i) scratch_[size_t(banned[i])] = saved[i];
  return scratch_;
}

// top-k, then top-p, then min-p, each keeping a prefix of the sampling order (weights only fall along it).
std::optional<Sampler::Cut> Sampler::cut(RowView& row) const {
  if (!row.ensure(1)) return std::nullopt;
  Cut c;
  const size_t V = row.vocab();
  c.max = row.at(0).logit;
  c.inv_t = 1.0 / params_.temperature;
  const size_t cap = params_.top_k > 0 && size_t(params_.top_k) < V ? size_t(params_.top_k) : V;
  // Σ weights of the first n tokens: summed along the order, or over the whole row in column order.
  auto mass = [&](size_t n) -> std::optional<double> {
    if (n == V) return row.total_weight(c.inv_t);
    if (!row.ensure(n)) return std::nullopt;
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += c.weight(row, i);
    return s;
  };
  std::optional<double> cap_mass;
  c.n = cap;
  if (params_.top_p < 1.0f) {
    // The smallest set of most likely tokens whose mass reaches top_p (at least one).
    cap_mass = mass(cap);
    if (!cap_mass) return std::nullopt;
    const double target = params_.top_p * *cap_mass;
    double acc = 0;
    size_t i = 0;
    for (; i < cap && acc < target; ++i) {
      if (!row.ensure(i + 1)) return std::nullopt;
      acc += c.weight(row, i);
    }
    c.n = std::max<size_t>(i, 1);
  }
  if (params_.min_p > 0.0f) {
    // p >= min_p * p_max, i.e. weight >= min_p (the best token has weight 1).
    size_t i = 0;
    for (; i < c.n; ++i) {
      if (!row.ensure(i + 1)) return std::nullopt;
      if (!(c.weight(row, i) >= double(params_.min_p))) break;
    }
    c.n = std::max<size_t>(i, 1);
  }
  std::optional<double> total = c.n == cap && cap_mass ? cap_mass : mass(c.n);
  if (!total) return std::nullopt;
  c.total = *total;
  return c;
}

std::optional<int32_t> Sampler::choose(RowView& row) {
  next_u_ = 0;
  if (constraint_active_) return choose_constrained(row);
  if (params_.temperature <= 0.0f || params_.top_k == 1) {
    if (!row.ensure(1)) return std::nullopt;
    return row.at(0).token;
  }
  std::optional<Cut> c = cut(row);
  if (!c) return std::nullopt;
  // Tokens of weight 0 (banned, underflowed) never come up; they sit at the back of the order.
  if (c->n >= 2 && !row.ensure(2)) return std::nullopt;
  if (!(c->weight(row, 0) > 0) || c->n < 2 || !(c->weight(row, 1) > 0))
    return row.at(0).token;  // one possible token (or every logit -inf): no draw
  const double u = next_uniform();
  double acc = 0;
  size_t last = 0;
  for (size_t i = 0; i < c->n; ++i) {
    if (!row.ensure(i + 1)) return std::nullopt;
    const double w = c->weight(row, i);
    if (!(w > 0)) break;
    acc += float(w / c->total);
    last = i;
    if (u < acc) return row.at(i).token;
  }
  return row.at(last).token;  // rounding leftovers go to the last token with weight
}

std::vector<TokenProb> Sampler::distribution(std::span<const float> raw, std::span<const int32_t> banned) {
  sampling::FullRow row(prepare(raw, banned));
  if (params_.temperature <= 0.0f || params_.top_k == 1) {
    row.ensure(1);
    return {{row.at(0).token, 1.0f}};
  }
  const Cut c = *cut(row);
  std::vector<TokenProb> out;
  for (size_t i = 0; i < c.n; ++i) {
    row.ensure(i + 1);
    const double w = c.weight(row, i);
    if (!(w > 0)) break;
    out.push_back({row.at(i).token, float(w / c.total)});
  }
  if (out.empty()) out.push_back({row.at(0).token, 1.0f});  // every logit was -inf
  return out;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> banned) {
  sampling::FullRow row(prepare(logits, banned));
  const int32_t token = *choose(row);
  pending_u_.clear();
  if (token != kNoToken) accept(token);
  return token;
}

std::optional<int32_t> Sampler::sample(const LogitCandidates& candidates, std::span<const int32_t> banned) {
  if (has_penalties()) return std::nullopt;
  if (candidates.complete()) {  // a small vocabulary: the candidates are the row
    std::vector<float> row(size_t(candidates.vocab));
    for (size_t i = 0; i < candidates.tokens.size(); ++i)
      row[size_t(candidates.tokens[i])] = candidates.logits[i];
    return sample(row, banned);
  }
  sampling::CandidateRow row(candidates, banned);
  // A banned token at the front with only -inf after it: the full row decides whether everything is banned.
  if (row.ensure(1) && row.at(0).logit == kNegInf) return std::nullopt;
  std::optional<int32_t> token = choose(row);
  if (!token) return std::nullopt;
  pending_u_.clear();
  if (*token != kNoToken) accept(*token);
  return token;
}

LogprobEntry compute_logprobs(std::span<const float> logits, int32_t token, int top_n) {
  float max_logit = kNegInf;
  for (float l : logits) max_logit = std::max(max_logit, l);
  double sum = 0;
  for (float l : logits) sum += std::exp(double(l - max_logit));
  const float lse = max_logit + float(std::log(sum));

  LogprobEntry e;
  e.token = token;
  e.logprob = logits[size_t(token)] - lse;
  if (top_n > 0) {
    size_t n = std::min(size_t(top_n), logits.size());
    std::vector<int32_t> idx(logits.size());
    std::iota(idx.begin(), idx.end(), 0);
    auto better = [&](int32_t a, int32_t b) {
      return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
    };
    std::partial_sort(idx.begin(), idx.begin() + int64_t(n), idx.end(), better);
    for (size_t i = 0; i < n; ++i) e.top.push_back({idx[i], logits[size_t(idx[i])] - lse});
  }
  return e;
}

std::optional<LogprobEntry> compute_logprobs(const LogitCandidates& row, int32_t token, int top_n) {
  const size_t n = std::min(size_t(std::max(top_n, 0)), size_t(row.vocab));
  if (n > row.tokens.size()) return std::nullopt;
  auto at = std::find(row.tokens.begin(), row.tokens.end(), token);
  if (at == row.tokens.end()) return std::nullopt;
  const float lse = row.max + float(std::log(row.sum_exp));
  LogprobEntry e;
  e.token = token;
  e.logprob = row.logits[size_t(at - row.tokens.begin())] - lse;
  for (size_t i = 0; i < n; ++i) e.top.push_back({row.tokens[i], row.logits[i] - lse});
  return e;
}

}  // namespace moeserve
