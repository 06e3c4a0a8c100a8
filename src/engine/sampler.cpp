#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace moeserve {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Candidates for top-p when no top-k narrows the field: the nucleus almost always lies in the few hundred
// most likely tokens, so sort those first and fall back to a full sort only when their mass is short.
constexpr size_t kNucleusProbe = 1024;

struct Candidate {
  float logit;
  int32_t token;
};

bool higher(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.token < b.token);
}

}  // namespace

Sampler::Sampler(const SamplingParams& params, std::span<const int32_t> prompt, uint64_t seed)
    : params_(params), rng_(seed) {
  if (params_.repetition_penalty != 1.0f) seen_.insert(prompt.begin(), prompt.end());
}

bool Sampler::has_penalties() const {
  return params_.repetition_penalty != 1.0f || params_.frequency_penalty != 0.0f ||
         params_.presence_penalty != 0.0f;
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
}

void Sampler::accept(int32_t token) {
  if (params_.repetition_penalty != 1.0f) seen_.insert(token);
  if (params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f) ++generated_[token];
}

double Sampler::uniform() {
  return double(rng_() >> 11) * 0x1.0p-53;
}

std::vector<TokenProb> Sampler::distribution(std::span<const float> raw, std::span<const int32_t> banned) {
  std::span<const float> logits = raw;
  bool need_copy = has_penalties();
  for (int32_t t : banned) need_copy |= raw[size_t(t)] != kNegInf;
  if (need_copy) {
    scratch_.assign(raw.begin(), raw.end());
    apply_penalties(scratch_);
    bool all_banned = true;
    std::vector<float> saved;
    for (int32_t t : banned) {
      saved.push_back(scratch_[size_t(t)]);
      scratch_[size_t(t)] = kNegInf;
    }
    for (float l : scratch_) all_banned &= l == kNegInf;
    if (all_banned)  // nothing else is possible: ignore the ban rather than divide by zero
      for (size_t i = 0; i < banned.size(); ++i) scratch_[size_t(banned[i])] = saved[i];
    logits = scratch_;
  }

  const size_t V = logits.size();
  if (params_.temperature <= 0.0f || params_.top_k == 1) {
    size_t best = 0;
    for (size_t i = 1; i < V; ++i)
      if (logits[i] > logits[best]) best = i;
    return {{int32_t(best), 1.0f}};
  }

  std::vector<Candidate> cand(V);
  for (size_t i = 0; i < V; ++i) cand[i] = {logits[i], int32_t(i)};
  auto order_prefix = [&](size_t n) {  // cand[0, n) = the n best, sorted
    if (n < cand.size()) std::nth_element(cand.begin(), cand.begin() + int64_t(n), cand.end(), higher);
    std::sort(cand.begin(), cand.begin() + int64_t(n), higher);
  };
  if (params_.top_k > 0 && size_t(params_.top_k) < V) {
    std::nth_element(cand.begin(), cand.begin() + params_.top_k, cand.end(), higher);
    cand.resize(size_t(params_.top_k));
  }

  const double inv_t = 1.0 / params_.temperature;
  float max_logit = kNegInf;
  for (const auto& c : cand) max_logit = std::max(max_logit, c.logit);
  auto exp_weight = [&](const Candidate& c) { return std::exp(double(c.logit - max_logit) * inv_t); };
  double z = 0;
  for (const auto& c : cand) z += exp_weight(c);

  size_t n = cand.size();
  if (params_.top_p < 1.0f) {
    // The smallest set of most likely tokens whose mass reaches top_p (at least one).
    const double target = params_.top_p * z;
    size_t sorted = std::min(kNucleusProbe, n);
    order_prefix(sorted);
    double mass = 0;
    size_t i = 0;
    for (; i < sorted && mass < target; ++i) mass += exp_weight(cand[i]);
    if (mass < target && sorted < n) {  // the probe was too short
      order_prefix(n);
      for (; i < n && mass < target; ++i) mass += exp_weight(cand[i]);
    }
    n = std::max<size_t>(i, 1);
  }
  if (params_.min_p > 0.0f) {
    // p >= min_p * p_max, i.e. weight >= min_p (the best token has weight 1).
    auto end = std::partition(cand.begin(), cand.begin() + int64_t(n),
                              [&](const Candidate& c) { return exp_weight(c) >= double(params_.min_p); });
    n = std::max<size_t>(size_t(end - cand.begin()), 1);
  }

  double total = 0;
  for (size_t i = 0; i < n; ++i) total += exp_weight(cand[i]);
  std::vector<TokenProb> out;
  for (size_t i = 0; i < n; ++i) {
    double w = exp_weight(cand[i]);
    if (w > 0) out.push_back({cand[i].token, float(w / total)});  // banned tokens (-inf) never appear
  }
  if (out.empty())
    out.push_back({cand[0].token, 1.0f});  // every logit was -inf: keep going, deterministically
  return out;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> banned) {
  std::vector<TokenProb> dist = distribution(logits, banned);
  int32_t token = dist[0].token;
  if (dist.size() > 1) {
    double u = uniform(), acc = 0;
    token = dist.back().token;  // rounding leftovers go to the last candidate
    for (const auto& c : dist) {
      acc += c.prob;
      if (u < acc) {
        token = c.token;
        break;
      }
    }
  }
  accept(token);
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

}  // namespace moeserve
