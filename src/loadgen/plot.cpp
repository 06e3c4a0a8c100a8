#include "loadgen/plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "loadgen/stats.h"

namespace moeserve::loadgen {
namespace {

using nlohmann::json;

// Tableau 10: distinct for the colour-blind and in greyscale print.
constexpr const char* kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
const char* colour(size_t i) {
  return kPalette[i % std::size(kPalette)];
}

std::string escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// 1234 -> "1.2k", 0.5 -> "0.5": short tick labels.
std::string tick_label(double v) {
  double a = std::fabs(v);
  if (a >= 1e6) return fmt::format("{:g}M", v / 1e6);
  if (a >= 1e4) return fmt::format("{:g}k", v / 1e3);
  if (a >= 1e3) return fmt::format("{:g}k", std::round(v / 100) / 10);
  return fmt::format("{:g}", v);
}

// A linear or log10 axis mapping data values onto [pixel_lo, pixel_hi].
struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  double base = 10;  // of a log axis: 10 for latencies, 2 for concurrency
  double pixel_lo = 0, pixel_hi = 1;

  double map(double v) const {
    double t = log ? std::log(std::max(v, lo) / lo) / std::log(hi / lo) : (v - lo) / (hi - lo);
    return pixel_lo + std::clamp(t, 0.0, 1.0) * (pixel_hi - pixel_lo);
  }

  std::vector<double> ticks() const {
    std::vector<double> out;
    if (log) {
      // Powers of the base; for a few decades also 2x and 5x, which keeps labels from colliding.
      double decades = std::log10(hi / lo);
      std::vector<double> steps =
          base == 10 && decades <= 3 ? std::vector<double>{1, 2, 5} : std::vector<double>{1};
      double stride = base == 10 && decades > 6 ? 100 : base;
      for (double p = std::pow(base, std::floor(std::log(lo) / std::log(base))); p <= hi * 1.001; p *= stride)
        for (double m : steps)
          if (m * p >= lo * 0.999 && m * p <= hi * 1.001) out.push_back(m * p);
      return out;
    }
    double step = nice_step((hi - lo) / 5);
    for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push_back(v);
    return out;
  }

  static double nice_step(double raw) {
    double p = std::pow(10, std::floor(std::log10(raw)));
    for (double m : {1.0, 2.0, 2.5, 5.0})
      if (raw <= m * p) return m * p;
    return 10 * p;
  }

  // A linear axis from 0 to a round number above max, or a log axis over [min, max] when they span more than
  // a factor of 30 (latency tails otherwise squash everything else into the left edge).
  static Axis fit(double min_positive, double max, bool allow_log) {
    Axis a;
    if (!(max > 0)) max = 1;
    if (allow_log && min_positive > 0 && max / min_positive > 30) {
      a.log = true;
      a.lo = std::pow(10, std::floor(std::log10(min_positive)));
      a.hi = std::pow(10, std::ceil(std::log10(max)));
      return a;
    }
    double step = nice_step(max / 5);
    a.lo = 0;
    a.hi = std::ceil(max / step) * step;
    return a;
  }
};

struct Series {
  Series(std::string name_, std::string colour_, std::vector<std::pair<double, double>> points_ = {})
      : name(std::move(name_)), colour(std::move(colour_)), points(std::move(points_)) {}

  std::string name;
  std::string colour;
  std::vector<std::pair<double, double>> points;
  bool dashed = false;
  bool markers = false;
  std::vector<std::pair<double, double>> band_lo, band_hi;  // a shaded range around the line
};

class Svg {
 public:
  void add(std::string element) { body_ += element + "\n"; }

  void text(double x, double y, std::string_view s, std::string_view cls, std::string_view anchor = "start") {
    add(fmt::format(R"(<text x="{:.1f}" y="{:.1f}" class="{}" text-anchor="{}">{}</text>)", x, y, cls, anchor,
                    escape(s)));
  }

  // One chart: frame, grid, ticks, axis titles and the series (lines, bands, markers).
  void panel(double x, double y, double w, double h, const std::string& title, const std::string& x_title,
             const std::string& y_title, Axis xa, Axis ya, const std::vector<Series>& series,
             bool legend = false) {
    const double left = 52, right = 12, top = 30, bottom = 40;
    xa.pixel_lo = x + left;
    xa.pixel_hi = x + w - right;
    ya.pixel_lo = y + h - bottom;
    ya.pixel_hi = y + top;
    add(fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" rx="6" class="card"/>)", x,
                    y, w, h));
    text(x + 12, y + 19, title, "panel-title");
    for (double t : ya.ticks()) {
      double py = ya.map(t);
      add(fmt::format(R"(<line x1="{:.1f}" x2="{:.1f}" y1="{:.1f}" y2="{:.1f}" class="grid"/>)", xa.pixel_lo,
                      xa.pixel_hi, py, py));
      text(xa.pixel_lo - 6, py + 3.5, tick_label(t), "tick", "end");
    }
    for (double t : xa.ticks()) {
      double px = xa.map(t);
      add(fmt::format(R"(<line x1="{:.1f}" x2="{:.1f}" y1="{:.1f}" y2="{:.1f}" class="grid"/>)", px, px,
                      ya.pixel_hi, ya.pixel_lo));
      text(px, ya.pixel_lo + 14, tick_label(t), "tick", "middle");
    }
    add(fmt::format(R"(<line x1="{:.1f}" x2="{:.1f}" y1="{:.1f}" y2="{:.1f}" class="axis"/>)", xa.pixel_lo,
                    xa.pixel_hi, ya.pixel_lo, ya.pixel_lo));
    text((xa.pixel_lo + xa.pixel_hi) / 2, y + h - 8, x_title, "axis-title", "middle");
    add(fmt::format(R"svg(<text transform="translate({:.1f},{:.1f}) rotate(-90)" class="axis-title" )svg"
                    R"svg(text-anchor="middle">{}</text>)svg",
                    x + 13, (ya.pixel_lo + ya.pixel_hi) / 2, escape(y_title)));
    for (const Series& s : series) {
      if (!s.band_lo.empty()) {
        std::string pts;
        for (auto [px, py] : s.band_hi) pts += fmt::format("{:.1f},{:.1f} ", xa.map(px), ya.map(py));
        for (auto it = s.band_lo.rbegin(); it != s.band_lo.rend(); ++it)
          pts += fmt::format("{:.1f},{:.1f} ", xa.map(it->first), ya.map(it->second));
        add(fmt::format(R"(<polygon points="{}" fill="{}" fill-opacity="0.16" stroke="none"/>)", pts,
                        s.colour));
      }
      std::string pts;
      for (auto [px, py] : s.points) pts += fmt::format("{:.1f},{:.1f} ", xa.map(px), ya.map(py));
      add(fmt::format(
          R"(<polyline points="{}" fill="none" stroke="{}" stroke-width="2" {}stroke-linejoin="round">)"
          R"(<title>{}</title></polyline>)",
          pts, s.colour, s.dashed ? R"(stroke-dasharray="5 4" )" : "", escape(s.name)));
      if (s.markers)
        for (auto [px, py] : s.points)
          add(fmt::format(
              R"(<circle cx="{:.1f}" cy="{:.1f}" r="3.5" fill="#fff" stroke="{}" stroke-width="2">)"
              R"(<title>{}: {} → {}</title></circle>)",
              xa.map(px), ya.map(py), s.colour, escape(s.name), tick_label(px), tick_label(py)));
    }
    if (legend) {
      double ly = ya.pixel_hi + 4;
      for (const Series& s : series) {
        if (s.dashed) continue;
        add(fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="10" height="10" rx="2" fill="{}"/>)",
                        xa.pixel_lo + 8, ly, s.colour));
        text(xa.pixel_lo + 22, ly + 9, s.name, "legend");
        ly += 15;
      }
    }
  }

  std::string finish(double width, double height) const {
    return fmt::format(
        R"(<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{0:.0f}" height="{1:.0f}" viewBox="0 0 {0:.0f} {1:.0f}">
<style>
text {{ font-family: "Inter", "Helvetica Neue", Helvetica, Arial, sans-serif; fill: #2b2b2b; }}
.title {{ font-size: 20px; font-weight: 600; }}
.subtitle {{ font-size: 12px; fill: #6b6b6b; }}
.section {{ font-size: 14px; font-weight: 600; fill: #444; }}
.panel-title {{ font-size: 13px; font-weight: 600; }}
.tick {{ font-size: 10px; fill: #777; }}
.axis-title {{ font-size: 11px; fill: #555; }}
.legend {{ font-size: 11px; }}
.note {{ font-size: 12px; fill: #888; }}
.card {{ fill: #ffffff; stroke: #e3e3e3; }}
.grid {{ stroke: #eeeeee; stroke-width: 1; }}
.axis {{ stroke: #9a9a9a; stroke-width: 1; }}
</style>
<rect width="100%" height="100%" fill="#f7f7f5"/>
{2}</svg>
)",
        width, height, body_);
  }

 private:
  std::string body_;
};

std::string run_name(const json& run) {
  std::string name = run.value("scenario", "?");
  double rate = run.value("request_rate", 0.0);
  if (rate > 0) return name + fmt::format(" r={:g}/s", rate);
  return name + fmt::format(" c={}", run.value("concurrency", 0));
}

// The values of one latency metric of a run, in ms (itl_ms pools every gap of every request).
std::vector<double> metric_values(const json& run, const std::string& key) {
  std::vector<double> v;
  if (!run.contains("requests")) return v;
  for (const json& r : run["requests"]) {
    if (!r.value("ok", false)) continue;
    if (key == "itl_ms") {
      if (r.contains("itl_ms"))
        for (double x : r["itl_ms"]) v.push_back(x);
    } else if (key == "tpot_ms") {
      if (r.value("completion_tokens", 0) > 1) v.push_back(r.value(key, 0.0));
    } else {
      v.push_back(r.value(key, 0.0));
    }
  }
  std::sort(v.begin(), v.end());
  return v;
}

// An empirical CDF drawn through at most 300 quantiles: enough to be exact to the eye for any sample size.
std::vector<std::pair<double, double>> cdf(const std::vector<double>& sorted) {
  std::vector<std::pair<double, double>> pts;
  if (sorted.empty()) return pts;
  size_t steps = std::min<size_t>(300, sorted.size());
  for (size_t i = 0; i <= steps; ++i) {
    double q = static_cast<double>(i) / static_cast<double>(steps);
    pts.push_back({percentile_sorted(sorted, q * 100), q});
  }
  return pts;
}

}  // namespace

std::string plot_svg(const json& document) {
  const json runs = document.value("runs", json::array());
  const json config = document.value("config", json::object());
  const double width = 1240, margin = 24, gap = 16;
  Svg svg;
  double y = margin;

  svg.text(margin, y + 20, "moeserve bench · " + document.value("label", std::string("results")), "title");
  std::string subtitle = fmt::format(
      "{}   model {}   input {} tok   output {} tok   {}", config.value("url", ""), config.value("model", ""),
      config.value("input_len", 0), config.value("output_len", 0), document.value("started_at", ""));
  svg.text(margin, y + 40, subtitle, "subtitle");
  y += 56;

  // The run legend: every latency panel colours runs the same way.
  double lx = margin;
  for (size_t i = 0; i < runs.size(); ++i) {
    std::string name = run_name(runs[i]);
    double item = 24 + 7.0 * static_cast<double>(name.size());
    if (lx + item > width - margin) {
      lx = margin;
      y += 18;
    }
    svg.add(fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="14" height="4" rx="2" fill="{}"/>)", lx, y + 5,
                        colour(i)));
    svg.text(lx + 20, y + 11, name, "legend");
    lx += item;
  }
  y += 26;
  if (runs.empty()) {
    svg.text(margin, y + 20, "No runs in this document.", "note");
    return svg.finish(width, y + 40 + margin);
  }

  // Row 1: latency CDFs.
  svg.text(margin, y + 12, "Latency distributions (share of requests at or below each latency)", "section");
  y += 22;
  const double panel_w = (width - 2 * margin - 3 * gap) / 4, panel_h = 250;
  const std::pair<const char*, const char*> metrics[] = {{"ttft_ms", "Time to first token"},
                                                         {"tpot_ms", "Time per output token"},
                                                         {"itl_ms", "Inter-token latency"},
                                                         {"e2e_ms", "End-to-end latency"}};
  for (size_t m = 0; m < std::size(metrics); ++m) {
    std::vector<Series> series;
    double lo = 0, hi = 0;
    for (size_t i = 0; i < runs.size(); ++i) {
      std::vector<double> values = metric_values(runs[i], metrics[m].first);
      if (values.empty()) continue;
      auto first_positive = std::upper_bound(values.begin(), values.end(), 0.0);
      if (first_positive != values.end() && (lo == 0 || *first_positive < lo)) lo = *first_positive;
      hi = std::max(hi, values.back());
      series.push_back({run_name(runs[i]), colour(i), cdf(values)});
    }
    Axis ya;
    ya.lo = 0;
    ya.hi = 1;
    svg.panel(margin + static_cast<double>(m) * (panel_w + gap), y, panel_w, panel_h, metrics[m].second, "ms",
              "fraction of requests", Axis::fit(lo, hi, true), ya, series);
  }
  y += panel_h + gap;

  // Row 2: multi-turn runs, per turn.
  std::vector<size_t> turn_runs;
  for (size_t i = 0; i < runs.size(); ++i)
    if (runs[i].contains("summary") && runs[i]["summary"].contains("per_turn")) turn_runs.push_back(i);
  if (!turn_runs.empty()) {
    svg.text(margin, y + 12, "Dialogues: each turn's prompt is the whole conversation so far", "section");
    y += 22;
    std::vector<Series> ttft, cached;
    double ttft_max = 0, turns = 1;
    for (size_t i : turn_runs) {
      Series median{run_name(runs[i]), colour(i)}, share{run_name(runs[i]), colour(i)};
      median.markers = share.markers = true;
      // Per-turn quantiles from the records: the band spans p10..p90 of that turn's TTFT.
      std::map<size_t, std::vector<double>> by_turn;
      for (const json& r : runs[i].value("requests", json::array()))
        if (r.value("ok", false)) by_turn[r.value("turn", size_t{0}) + 1].push_back(r.value("ttft_ms", 0.0));
      for (auto& [turn, values] : by_turn) {
        std::sort(values.begin(), values.end());
        double t = static_cast<double>(turn);
        median.points.push_back({t, percentile_sorted(values, 50)});
        median.band_lo.push_back({t, percentile_sorted(values, 10)});
        median.band_hi.push_back({t, percentile_sorted(values, 90)});
        ttft_max = std::max(ttft_max, percentile_sorted(values, 90));
        turns = std::max(turns, t);
      }
      for (const json& t : runs[i]["summary"]["per_turn"])
        share.points.push_back({t.value("turn", 0.0), 100 * t.value("cached_tokens_ratio", 0.0)});
      ttft.push_back(std::move(median));
      cached.push_back(std::move(share));
    }
    Axis turn_axis;
    turn_axis.lo = 1;
    turn_axis.hi = std::max(turns, 2.0);
    Axis pct;
    pct.lo = 0;
    pct.hi = 100;
    const double half_w = (width - 2 * margin - gap) / 2;
    svg.panel(margin, y, half_w, panel_h, "TTFT per turn (median, band p10–p90)", "turn", "ms", turn_axis,
              Axis::fit(0, ttft_max, false), ttft);
    svg.panel(margin + half_w + gap, y, half_w, panel_h,
              "Prompt tokens served from the prefix cache (usage cached_tokens)", "turn",
              "% of prompt tokens", turn_axis, pct, cached);
    y += panel_h + gap;
  }

  // Row 3: a sweep (one scenario at several concurrencies).
  std::map<std::string, std::vector<const json*>> sweep;
  std::vector<std::string> sweep_order;
  for (const json& run : runs) {
    if (run.value("request_rate", 0.0) > 0 || !run.contains("summary")) continue;
    std::string scenario = run.value("scenario", "?");
    if (!sweep.count(scenario)) sweep_order.push_back(scenario);
    sweep[scenario].push_back(&run);
  }
  bool has_sweep = false;
  for (auto& [scenario, list] : sweep) has_sweep |= list.size() > 1;
  if (has_sweep) {
    svg.text(margin, y + 12, "Sweep: throughput and latency against concurrency", "section");
    y += 22;
    std::vector<Series> throughput, ttft, tpot;
    double c_lo = 1e18, c_hi = 0, tp_max = 0, ttft_max = 0, tpot_max = 0;
    for (size_t k = 0; k < sweep_order.size(); ++k) {
      auto& list = sweep[sweep_order[k]];
      std::sort(list.begin(), list.end(),
                [](auto* a, auto* b) { return a->value("concurrency", 0) < b->value("concurrency", 0); });
      Series out{sweep_order[k] + " output", colour(k)}, total{sweep_order[k] + " total", colour(k)};
      Series t1{sweep_order[k], colour(k)}, t2{sweep_order[k], colour(k)};
      out.markers = t1.markers = t2.markers = total.markers = true;
      total.dashed = true;
      out.name = sweep_order[k];
      for (const json* run : list) {
        const json& s = (*run)["summary"];
        double c = run->value("concurrency", 1.0);
        c_lo = std::min(c_lo, c);
        c_hi = std::max(c_hi, c);
        out.points.push_back({c, s.value("output_throughput", 0.0)});
        total.points.push_back({c, s.value("total_throughput", 0.0)});
        t1.points.push_back({c, distribution_from_json(s["ttft_ms"]).median});
        t2.points.push_back({c, distribution_from_json(s["tpot_ms"]).median});
        tp_max = std::max(tp_max, s.value("total_throughput", 0.0));
        ttft_max = std::max(ttft_max, t1.points.back().second);
        tpot_max = std::max(tpot_max, t2.points.back().second);
      }
      throughput.push_back(std::move(out));
      throughput.push_back(std::move(total));
      ttft.push_back(std::move(t1));
      tpot.push_back(std::move(t2));
    }
    // Concurrency sweeps are usually powers of two: a log2 axis spaces them evenly.
    Axis conc = Axis::fit(0, c_hi, false);
    if (c_hi / c_lo >= 8) {
      conc.log = true;
      conc.base = 2;
      conc.lo = std::pow(2, std::floor(std::log2(c_lo)));
      conc.hi = std::pow(2, std::ceil(std::log2(c_hi)));
    }
    const double third_w = (width - 2 * margin - 2 * gap) / 3;
    svg.panel(margin, y, third_w, panel_h, "Throughput (solid output, dashed total)", "concurrency",
              "tokens/s", conc, Axis::fit(0, tp_max, false), throughput, true);
    svg.panel(margin + third_w + gap, y, third_w, panel_h, "Median time to first token", "concurrency", "ms",
              conc, Axis::fit(0, ttft_max, false), ttft, true);
    svg.panel(margin + 2 * (third_w + gap), y, third_w, panel_h, "Median time per output token",
              "concurrency", "ms", conc, Axis::fit(0, tpot_max, false), tpot, true);
    y += panel_h + gap;
  }
  return svg.finish(width, y + margin - gap);
}

}  // namespace moeserve::loadgen
