#include "loadgen/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>

namespace moeserve::loadgen {

bool stderr_is_terminal() {
  return isatty(STDERR_FILENO) == 1;
}

ProgressBar::ProgressBar(std::string title, bool enabled) : title_(std::move(title)), enabled_(enabled) {}

std::string ProgressBar::render(const std::string& title, const Progress& p, size_t width) {
  // Bounded by requests, by time, or by whichever comes first.
  double fraction = 0;
  if (p.planned > 0) fraction = static_cast<double>(p.completed + p.failed) / static_cast<double>(p.planned);
  if (p.duration_s > 0) fraction = std::max(fraction, p.elapsed_s / p.duration_s);
  if (p.finished) fraction = 1;
  fraction = std::clamp(fraction, 0.0, 1.0);
  // Eighth blocks give the bar sub-character resolution.
  static const char* kEighths[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
  size_t eighths = static_cast<size_t>(fraction * static_cast<double>(width * 8));
  std::string bar;
  for (size_t i = 0; i < eighths / 8; ++i) bar += "█";
  size_t used = eighths / 8;
  if (used < width && eighths % 8) {
    bar += kEighths[eighths % 8];
    ++used;
  }
  bar += std::string(width - used, ' ');
  size_t done = p.completed + p.failed;
  std::string count = p.planned > 0 ? fmt::format("{}/{}", done, p.planned) : fmt::format("{}", done);
  double rate = p.elapsed_s > 0 ? static_cast<double>(done) / p.elapsed_s : 0;
  int secs = static_cast<int>(p.elapsed_s);
  return fmt::format("{} │{}│ {} req  {:.1f} req/s  {} failed  {} in flight  {:02}:{:02}", title, bar, count,
                     rate, p.failed, p.in_flight, secs / 60, secs % 60);
}

void ProgressBar::update(const Progress& p) {
  if (!enabled_) return;
  // \r returns to the line start, \x1b[K clears what a longer previous line left behind.
  std::fprintf(stderr, "\r%s\x1b[K%s", render(title_, p).c_str(), p.finished ? "\n" : "");
  std::fflush(stderr);
}

}  // namespace moeserve::loadgen
