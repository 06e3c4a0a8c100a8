#pragma once
// The progress line on the terminal: one line redrawn in place on stderr, only when stderr is a terminal.

#include <cstdio>
#include <string>

#include "loadgen/client.h"

namespace moeserve::loadgen {

class ProgressBar {
 public:
  // enabled = false draws nothing (stderr redirected, or --quiet).
  ProgressBar(std::string title, bool enabled);
  void update(const Progress& p);

  // The line for `p`, `width` columns of bar; public so it can be tested.
  static std::string render(const std::string& title, const Progress& p, size_t width = 24);

 private:
  std::string title_;
  bool enabled_;
};

bool stderr_is_terminal();

}  // namespace moeserve::loadgen
