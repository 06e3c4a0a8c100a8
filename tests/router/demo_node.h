#pragma once
// One `moeserve serve --model demo` process on a free loopback port that stays the node's across restarts,
// for the tests that run real nodes (the router in front of them, the adversarial suite). The demo model's
// tokenizer is under .cache/ of the source root, the tests' working directory.

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "http_peer.h"

namespace moeserve::router::testing {

class DemoNode {
 public:
  // The log goes to TempDir()/<log_prefix><name>-<start>.log.
  explicit DemoNode(std::string name, std::string log_prefix = "real-node-")
      : name_(std::move(name)), log_prefix_(std::move(log_prefix)), port_(free_port()) {
    start();
  }
  void start() {
    ++starts_;
    process_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{MOESERVE_BINARY, "serve", "--model", "demo", "--served-model-name", "demo",
                                 "--host", "127.0.0.1", "--port", std::to_string(port_), "--http-threads",
                                 "1", "--cache-memory-gb", "0.05"},
        ChildOptions{.log_path = log()});
  }
  // Waits until /health answers 200; false when the process died first or timeout_ms passed.
  bool ready(int timeout_ms = 600'000) {
    return wait_http_ok(port_, "/health", process_.get(), std::chrono::milliseconds(timeout_ms));
  }
  void signal(int sig) { process_->signal(sig); }
  void kill() {
    process_->signal(SIGKILL);
    process_->wait_exit(std::chrono::seconds(10));
  }
  bool running() { return process_->running(); }
  uint16_t port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string log() const {
    return ::testing::TempDir() + log_prefix_ + name_ + "-" + std::to_string(starts_) + ".log";
  }
  // A counter or gauge of the node's own /metrics, summed over its label sets.
  double metric(const std::string& name) const {
    std::istringstream page(http_request(port_, "GET", "/metrics").body);
    double sum = 0;
    for (std::string line; std::getline(page, line);) {
      if (!line.starts_with(name) || line.size() <= name.size()) continue;
      char next = line[name.size()];
      if (next != ' ' && next != '{') continue;
      sum += std::strtod(line.c_str() + line.rfind(' ') + 1, nullptr);
    }
    return sum;
  }

 private:
  std::string name_;
  std::string log_prefix_;
  uint16_t port_;
  int starts_ = 0;
  std::unique_ptr<ChildProcess> process_;
};

}  // namespace moeserve::router::testing
