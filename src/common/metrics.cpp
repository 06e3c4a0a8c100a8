#include "common/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace moeserve {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    check(std::isfinite(bounds_[i]) && (i == 0 || bounds_[i] > bounds_[i - 1]),
          "histogram bounds must be finite and strictly increasing");
  }
  buckets_ = std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::observe(double v) {
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();  // first bound >= v
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

void Histogram::add(std::span<const uint64_t> per_bucket, double sum) {
  check(per_bucket.size() == bounds_.size() + 1, "histogram: {} bucket counts for {} buckets",
        per_bucket.size(), bounds_.size() + 1);
  uint64_t n = 0;
  for (size_t i = 0; i < per_bucket.size(); ++i) {
    buckets_[i].fetch_add(per_bucket[i], std::memory_order_relaxed);
    n += per_bucket[i];
  }
  count_.fetch_add(n, std::memory_order_relaxed);
  sum_.fetch_add(sum, std::memory_order_relaxed);
}

MetricsRegistry::MetricsRegistry(Labels const_labels) : const_labels_(std::move(const_labels)) {}

MetricsRegistry::Family& MetricsRegistry::family(const std::string& name, const std::string& help, Type type,
                                                 const std::vector<double>& bounds) {
  for (auto& f : families_) {
    if (f->name != name) continue;
    check(f->type == type, "metric {} registered twice with different types", name);
    check(f->bounds == bounds, "histogram {} registered twice with different buckets", name);
    return *f;
  }
  auto f = std::make_unique<Family>();
  f->name = name;
  f->help = help;
  f->type = type;
  f->bounds = bounds;
  families_.push_back(std::move(f));
  return *families_.back();
}

void MetricsRegistry::declare(const std::string& name, const std::string& help, Type type,
                              const std::vector<double>& bounds) {
  std::lock_guard lock(mutex_);
  family(name, help, type, bounds);
}

Counter& MetricsRegistry::counter(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard lock(mutex_);
  Family& f = family(name, help, Type::kCounter);
  auto [it, inserted] = f.index.try_emplace(labels, f.counters.size());
  if (inserted) f.counters.emplace_back();
  return f.counters[it->second];
}

Gauge& MetricsRegistry::gauge(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard lock(mutex_);
  Family& f = family(name, help, Type::kGauge);
  auto [it, inserted] = f.index.try_emplace(labels, f.gauges.size());
  if (inserted) f.gauges.emplace_back();
  return f.gauges[it->second];
}

Histogram& MetricsRegistry::histogram(const std::string& name, const std::string& help,
                                      const std::vector<double>& bounds, const Labels& labels) {
  std::lock_guard lock(mutex_);
  Family& f = family(name, help, Type::kHistogram, bounds);
  auto [it, inserted] = f.index.try_emplace(labels, f.histograms.size());
  if (inserted) f.histograms.emplace_back(bounds);
  return f.histograms[it->second];
}

void MetricsRegistry::add_collector(std::function<void()> collect) {
  std::lock_guard lock(mutex_);
  collectors_.push_back(std::move(collect));
}

namespace {

// Sample values in the Go float syntax Prometheus parses: shortest round-trip digits, +Inf/-Inf/NaN.
std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

std::string escape_label_value(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string escape_help(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

void append_labels(std::string& out, const Labels& a, const Labels& b, const char* le = nullptr) {
  if (a.empty() && b.empty() && !le) return;
  out += '{';
  bool first = true;
  auto add = [&](const std::string& k, const std::string& v) {
    if (!first) out += ',';
    first = false;
    out += k;
    out += "=\"";
    out += escape_label_value(v);
    out += '"';
  };
  for (auto& [k, v] : a) add(k, v);
  for (auto& [k, v] : b) add(k, v);
  if (le) add("le", le);
  out += '}';
}

}  // namespace

std::string MetricsRegistry::render() {
  std::vector<std::function<void()>> collectors;
  {
    std::lock_guard lock(mutex_);
    collectors = collectors_;
  }
  for (auto& collect : collectors) collect();

  std::lock_guard lock(mutex_);
  std::string out;
  out.reserve(16384);
  for (auto& f : families_) {
    static const char* kTypeNames[] = {"counter", "gauge", "histogram"};
    fmt::format_to(std::back_inserter(out), "# HELP {} {}\n# TYPE {} {}\n", f->name, escape_help(f->help),
                   f->name, kTypeNames[static_cast<int>(f->type)]);
    for (auto& [labels, i] : f->index) {
      if (f->type == Type::kCounter || f->type == Type::kGauge) {
        double v = f->type == Type::kCounter ? f->counters[i].value() : f->gauges[i].value();
        out += f->name;
        append_labels(out, const_labels_, labels);
        out += ' ';
        out += format_value(v);
        out += '\n';
        continue;
      }
      const Histogram& h = f->histograms[i];
      // One read per bucket, summed here: the rendering is monotone in le and _count equals the +Inf bucket
      // even while other threads observe.
      std::vector<uint64_t> cumulative(h.bounds().size() + 1);
      uint64_t running = 0;
      for (size_t b = 0; b <= h.bounds().size(); ++b) cumulative[b] = running += h.bucket_count(b);
      for (size_t b = 0; b <= h.bounds().size(); ++b) {
        std::string le = b < h.bounds().size() ? format_value(h.bounds()[b]) : "+Inf";
        out += f->name;
        out += "_bucket";
        append_labels(out, const_labels_, labels, le.c_str());
        fmt::format_to(std::back_inserter(out), " {}\n", cumulative[b]);
      }
      out += f->name;
      out += "_sum";
      append_labels(out, const_labels_, labels);
      out += ' ';
      out += format_value(h.sum());
      out += '\n';
      out += f->name;
      out += "_count";
      append_labels(out, const_labels_, labels);
      fmt::format_to(std::back_inserter(out), " {}\n", cumulative.back());
    }
  }
  return out;
}

std::vector<double> latency_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,
          0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 120.0};
}

std::vector<double> fine_latency_buckets() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
          0.1,    0.15,  0.2,    0.3,   0.4,  0.5,   0.75, 1.0,   2.5,  5.0,  10.0};
}

std::vector<double> token_count_buckets() {
  std::vector<double> b;
  for (double v = 1; v <= 262144; v *= 2) b.push_back(v);
  return b;
}

}  // namespace moeserve
