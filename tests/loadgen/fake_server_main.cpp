// loadgen_fake_server: the test suite's scripted OpenAI-compatible server as a program, for measuring the bench
// client's own overhead (docs/bench.md): `loadgen_fake_server [--ttft-ms N] [--itl-ms N]` prints its URL and
// serves until interrupted. Not a test; built next to them.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fake_openai_server.h"

int main(int argc, char** argv) {
  moeserve::loadgen::testing::FakeScript script;
  script.prefix_cache = false;  // O(history) per request; not what an overhead measurement wants
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    double value = std::atof(argv[i + 1]);
    if (flag == "--ttft-ms") {
      script.ttft_s = value / 1e3;
    } else if (flag == "--itl-ms") {
      script.itl_s = value / 1e3;
    } else {
      std::fprintf(stderr, "usage: %s [--ttft-ms N] [--itl-ms N]\n", argv[0]);
      return 2;
    }
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // server threads inherit the mask; main waits below
  moeserve::loadgen::testing::FakeOpenAiServer server(script);
  std::printf("%s\n", server.url().c_str());
  std::fflush(stdout);
  int received = 0;
  sigwait(&signals, &received);
  return 0;
}
