#include "model/verify.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"
#include "model/safetensors.h"
#include "model/sequence.h"

namespace moeserve {
namespace {

std::vector<int32_t> read_ids(const TensorSet& ref, const std::string& name) {
  const TensorInfo* t = ref.find(name);
  check(t != nullptr, "reference: missing tensor {}", name);
  check(t->dtype == DType::I64 && t->shape.size() == 1, "reference: {} must be I64 [T], is {}", name,
        t->describe());
  std::vector<int32_t> ids(size_t(t->shape[0]));
  const auto* src = reinterpret_cast<const int64_t*>(t->data);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(src[i]);
  return ids;
}

// A float32 reference tensor as [rows][cols] with the expected element count.
const float* read_f32(const TensorSet& ref, const std::string& name, int64_t expected_elements) {
  const TensorInfo* t = ref.find(name);
  check(t != nullptr, "reference: missing tensor {}", name);
  check(t->dtype == DType::F32 && t->numel() == expected_elements,
        "reference: {} is {}, expected {} float32 values", name, t->describe(), expected_elements);
  return reinterpret_cast<const float*>(t->data);
}

double max_abs_diff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

bool case_passed(const VerifyCase& c) {
  return c.max_abs_error <= c.tolerance && c.tokens_match;
}

// The bound of a case whose reference logits are ref[n].
double case_tolerance(const VerifyOptions& options, const float* ref, size_t n) {
  if (!options.relative) return options.tolerance;
  double scale = 1;
  for (size_t i = 0; i < n; ++i) scale = std::max(scale, double(std::fabs(ref[i])));
  return options.tolerance * scale;
}

// The MTP layer's own KV cache for one sequence of up to `tokens` positions, pages 0, 1, ...
struct MtpSequence {
  MtpSequence(const Qwen35Model& model, int64_t tokens)
      : kv(model.mtp_kv_cache_spec(kPage, (tokens + kPage - 1) / kPage)), pages(size_t(kv.spec().num_pages)) {
    std::iota(pages.begin(), pages.end(), 0);
  }
  static constexpr int kPage = 16;
  KvCache kv;
  std::vector<int32_t> pages;
};

}  // namespace

VerifyReport verify_mtp_against_reference(const Qwen35Model& model, const TensorSet& reference,
                                          const VerifyOptions& options) {
  const int64_t V = model.config().vocab_size, H = model.config().hidden_size;
  model.prepare_mtp();
  VerifyReport report;

  // mtpK: the rows of a whole prompt in one batched MTP step, from the reference's own hidden states.
  for (int i = 0; reference.find(fmt::format("mtp{}.input_ids", i)); ++i) {
    const std::string name = fmt::format("mtp{}", i);
    auto ids = read_ids(reference, name + ".input_ids");
    const int64_t T = int64_t(ids.size());
    check(T >= 2, "reference: {} needs at least 2 tokens", name);
    const float* hidden = read_f32(reference, name + ".hidden", T * H);
    MtpSequence seq(model, T);
    SequenceStep step{{ids.data() + 1, size_t(T - 1)}, 0, seq.pages, 0, true};
    auto out = model.mtp_forward({&step, 1}, {hidden, size_t((T - 1) * H)}, seq.kv);
    const float* expected = read_f32(reference, name + ".logits", (T - 1) * V);
    const size_t values = size_t((T - 1) * V);
    report.cases.push_back({name, T, 0, max_abs_diff(out.logits.data(), expected, values),
                            case_tolerance(options, expected, values)});
  }

  // chainK: the model's own greedy token and hidden states, then chained greedy drafts through the MTP cache.
  for (int i = 0; reference.find(fmt::format("chain{}.input_ids", i)); ++i) {
    const std::string name = fmt::format("chain{}", i);
    auto ids = read_ids(reference, name + ".input_ids");
    auto expected_ids = read_ids(reference, name + ".draft_ids");
    const int64_t T = int64_t(ids.size()), steps = int64_t(expected_ids.size());
    const float* expected = read_f32(reference, name + ".logits", steps * V);
    const int32_t next_token = read_ids(reference, name + ".next_token").at(0);

    SequenceRunner runner(model, T);
    auto target = runner.prefill(ids, false, false, true);
    VerifyCase c{name, T, steps, 0, case_tolerance(options, expected, size_t(steps * V))};
    const int32_t s = argmax(target.logits);
    c.tokens_match = s == next_token;
    if (!c.tokens_match) c.first_mismatch = 0;

    MtpSequence seq(model, T + steps);
    std::vector<int32_t> rows(ids.begin() + 1, ids.end());
    rows.push_back(next_token);  // the reference's, so the drafts stay comparable when s differs
    std::vector<float> hidden = std::move(target.hidden);
    SequenceStep step{rows, 0, seq.pages, 0, false};
    for (int64_t j = 0; j < steps; ++j) {
      auto out = model.mtp_forward({&step, 1}, hidden, seq.kv);
      c.max_abs_error =
          std::max(c.max_abs_error, max_abs_diff(out.logits.data(), expected + j * V, size_t(V)));
      const int32_t draft = argmax(out.logits);
      if (draft != expected_ids[size_t(j)] && c.tokens_match) {
        c.tokens_match = false;
        c.first_mismatch = j + 1;
      }
      // The next row: this draft at the next position, fed this step's MTP hidden (the reference's draft, as
      // for the next token).
      step.start_pos += int64_t(step.tokens.size());
      rows.assign(1, expected_ids[size_t(j)]);
      step.tokens = rows;
      hidden = std::move(out.hidden);
    }
    report.cases.push_back(c);
  }
  check(!report.cases.empty(), "MTP reference: no mtpN or chainN cases found");
  report.passed = std::all_of(report.cases.begin(), report.cases.end(), case_passed);
  return report;
}

VerifyReport verify_against_reference(const Qwen35Model& model, const TensorSet& reference,
                                      const VerifyOptions& options) {
  const auto& config = model.config();
  const int64_t V = config.vocab_size, H = config.hidden_size;
  VerifyReport report;

  for (int i = 0; reference.find(fmt::format("prompt{}.input_ids", i)); ++i) {
    const std::string name = fmt::format("prompt{}", i);
    auto ids = read_ids(reference, name + ".input_ids");
    const int64_t T = int64_t(ids.size());
    // Not every reference carries hidden states (the FP8 fixture's does not).
    const bool layers = options.compare_layers && i == 0 && reference.find(name + ".hidden_states");
    SequenceRunner runner(model, T, 16, options.kv_cache_dtype);
    auto out = runner.prefill(ids, true, layers);
    const float* expected = read_f32(reference, name + ".logits", T * V);
    report.cases.push_back({name, T, 0, max_abs_diff(out.logits.data(), expected, size_t(T * V)),
                            case_tolerance(options, expected, size_t(T * V))});

    if (layers) {
      const int L = config.num_layers;
      const float* hidden = read_f32(reference, name + ".hidden_states", (L + 1) * T * H);
      for (int l = 0; l <= L; ++l) {
        // Entry l is the output of layer l-1; HF replaces the last one by its final-normed form.
        std::string layer_name =
            l == 0 ? std::string("embeddings")
                   : fmt::format("layer {} ({}){}", l - 1,
                                 config.layer_types[l - 1] == LayerType::FullAttention ? "full_attention"
                                                                                       : "linear_attention",
                                 l == L ? " + final norm" : "");
        double err = max_abs_diff(out.hidden_states.data() + l * T * H, hidden + l * T * H, size_t(T * H));
        report.layers.push_back({layer_name, err});
        if (err > options.tolerance && report.first_divergent_layer.empty())
          report.first_divergent_layer = layer_name;
      }
    }
  }

  for (int i = 0; reference.find(fmt::format("gen{}.input_ids", i)); ++i) {
    const std::string name = fmt::format("gen{}", i);
    auto prompt = read_ids(reference, name + ".input_ids");
    auto expected_ids = read_ids(reference, name + ".output_ids");
    const int64_t steps = int64_t(expected_ids.size());
    const float* scores = read_f32(reference, name + ".scores", steps * V);
    // Teacher-forced: each step decodes the reference's token, so the logits stay comparable to the
    // reference's after a near-tie the model resolves the other way (a rounded KV cache can).
    SequenceRunner runner(model, int64_t(prompt.size()) + steps, 16, options.kv_cache_dtype);
    std::vector<float> logits = runner.prefill(prompt).logits;
    VerifyCase c{name, int64_t(prompt.size()), steps, 0, case_tolerance(options, scores, size_t(steps * V))};
    for (int64_t s = 0; s < steps; ++s) {
      if (s > 0) logits = runner.decode(expected_ids[s - 1]);
      c.max_abs_error = std::max(c.max_abs_error, max_abs_diff(logits.data(), scores + s * V, size_t(V)));
      if (argmax(logits) != expected_ids[s]) {
        if (c.first_mismatch < 0) c.first_mismatch = s;
        c.tokens_match = false;
        ++c.token_mismatches;
      }
    }
    report.cases.push_back(c);
  }
  check(!report.cases.empty(), "reference: no promptN or genN cases found");

  report.passed = std::all_of(report.cases.begin(), report.cases.end(), case_passed);
  return report;
}

}  // namespace moeserve
