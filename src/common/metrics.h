#pragma once
// A small Prometheus registry: counters, gauges and fixed-bucket histograms, optionally labelled, rendered as
// text exposition format 0.0.4. Updates are lock-free atomics (the hot path observes from engine and IO
// threads); creating a new label combination takes a lock once, after which the returned reference is stable.
// `moeserve serve` keeps one for its lifetime; `moeserve route` fills one per scrape from its balancer's
// state.

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace moeserve {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void inc(double amount = 1.0) { value_.fetch_add(amount, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void inc(double amount = 1.0) { value_.fetch_add(amount, std::memory_order_relaxed); }
  void dec(double amount = 1.0) { value_.fetch_sub(amount, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  // bounds: strictly increasing finite upper bounds; the +Inf bucket is implicit.
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // Observations counted elsewhere (the difference of two snapshots of a histogram kept by the engine):
  // per_bucket[i] more in bucket i as bucket_count() numbers them (bounds().size() + 1 entries), `sum` more.
  void add(std::span<const uint64_t> per_bucket, double sum);

  const std::vector<double>& bounds() const { return bounds_; }
  // Observations in (bounds()[i-1], bounds()[i]]; i == bounds().size() is the +Inf bucket. Not cumulative.
  uint64_t bucket_count(size_t i) const { return buckets_[i].load(std::memory_order_relaxed); }
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // per-bucket (not cumulative); last is +Inf
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0.0};
};

class MetricsRegistry {
 public:
  enum class Type { kCounter, kGauge, kHistogram };

  // const_labels go on every sample (e.g. model_name), the way vLLM labels all its metrics.
  explicit MetricsRegistry(Labels const_labels = {});

  // The same name + labels returns the same metric. A name registered with another type, or a histogram
  // re-registered with other buckets, is a programming error and throws moeserve::Error.
  Counter& counter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& gauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& histogram(const std::string& name, const std::string& help, const std::vector<double>& bounds,
                       const Labels& labels = {});

  // A family with no samples yet: its HELP and TYPE render all the same, so the exposition lists what it
  // reports before the first event.
  void declare(const std::string& name, const std::string& help, Type type,
               const std::vector<double>& bounds = {});

  // Collectors run at the start of render(), to refresh gauges that mirror state owned elsewhere.
  void add_collector(std::function<void()> collect);

  std::string render();

 private:
  struct Family {
    std::string name, help;
    Type type;
    std::vector<double> bounds;
    std::map<Labels, size_t> index;  // labels -> position in the typed deque below
    std::deque<Counter> counters;
    std::deque<Gauge> gauges;
    std::deque<Histogram> histograms;
  };
  Family& family(const std::string& name, const std::string& help, Type type,
                 const std::vector<double>& bounds = {});

  Labels const_labels_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<Family>> families_;  // in registration order, for a stable rendering
  std::vector<std::function<void()>> collectors_;
};

// Exponential-ish bucket helpers for latencies (seconds) and token counts.
std::vector<double> latency_buckets();       // 1 ms .. 120 s
std::vector<double> fine_latency_buckets();  // 0.5 ms .. 10 s, for inter-token latency
std::vector<double> token_count_buckets();   // 1 .. 262144, powers of two

}  // namespace moeserve
