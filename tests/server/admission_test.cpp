// Admission control: concurrency cap, bounded FIFO queue (429), draining and memory pressure (503).
#include <gtest/gtest.h>

#include <filesystem>
#include <unistd.h>

#include <fstream>

#include "server/admission.h"
#include "server/api_error.h"

namespace moeserve::server {
namespace {

int status_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ApiError& e) {
    return e.status;
  }
  return 0;
}

TEST(Admission, RunsUpToTheCapThenQueuesInOrder) {
  Admission adm({.max_running = 2, .max_queued = 2}, nullptr);
  std::vector<int> admitted;
  auto a = adm.enter(1, [&] { admitted.push_back(1); });
  auto b = adm.enter(1, [&] { admitted.push_back(2); });
  auto c = adm.enter(1, [&] { admitted.push_back(3); });
  auto d = adm.enter(1, [&] { admitted.push_back(4); });
  EXPECT_EQ(admitted, (std::vector<int>{1, 2}));
  EXPECT_EQ(c->state(), Admission::Ticket::State::kQueued);
  EXPECT_EQ(adm.stats().running, 2);
  EXPECT_EQ(adm.stats().queued, 2);

  int status = 0;
  try {
    adm.enter(1, [] {});
  } catch (const ApiError& e) {
    status = e.status;
    EXPECT_EQ(e.retry_after_s, 1);
  }
  EXPECT_EQ(status, 429);
  EXPECT_EQ(adm.stats().rejected_queue_full, 1u);

  EXPECT_EQ(a->leave(), Admission::Ticket::State::kRunning);
  EXPECT_EQ(admitted, (std::vector<int>{1, 2, 3}));
  b.reset();  // destroying a ticket gives its capacity back
  EXPECT_EQ(admitted, (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(adm.stats().queued, 0);
}

TEST(Admission, LeavingTheQueueFreesItsPlace) {
  Admission adm({.max_running = 1, .max_queued = 1}, nullptr);
  bool second = false;
  auto a = adm.enter(1, [] {});
  auto b = adm.enter(1, [&] { second = true; });
  EXPECT_EQ(b->leave(), Admission::Ticket::State::kQueued);  // queue timeout or client gone
  EXPECT_FALSE(second);
  auto c = adm.enter(1, [] {});  // the queue has room again
  EXPECT_EQ(c->state(), Admission::Ticket::State::kQueued);
  a->leave();
  EXPECT_EQ(c->state(), Admission::Ticket::State::kRunning);
  EXPECT_FALSE(second);
}

TEST(Admission, WeightCountsSequencesAndQueueIsStrictFifo) {
  Admission adm({.max_running = 4, .max_queued = 8}, nullptr);
  auto a = adm.enter(3, [] {});
  auto big = adm.enter(2, [] {});   // does not fit next to 3
  auto small = adm.enter(1, [] {});  // would fit, but must not overtake
  EXPECT_EQ(big->state(), Admission::Ticket::State::kQueued);
  EXPECT_EQ(small->state(), Admission::Ticket::State::kQueued);
  a->leave();
  EXPECT_EQ(big->state(), Admission::Ticket::State::kRunning);
  EXPECT_EQ(small->state(), Admission::Ticket::State::kRunning);
  EXPECT_EQ(adm.stats().running, 3);
  EXPECT_EQ(status_of([&] { adm.enter(5, [] {}); }), 400);  // can never run
}

TEST(Admission, DrainingRefusesWith503) {
  Admission adm({}, nullptr);
  adm.set_draining(true);
  EXPECT_EQ(status_of([&] { adm.enter(1, [] {}); }), 503);
  EXPECT_EQ(adm.stats().rejected_draining, 1u);
}

class FakeRoot {
 public:
  FakeRoot() : dir_(testing::TempDir() + "memroot-" + std::to_string(getpid()) + "-" + std::to_string(counter_++)) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ + "/proc");
  }
  void write(const std::string& rel, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(dir_ + "/" + rel).parent_path());
    std::ofstream(dir_ + "/" + rel) << text;
  }
  const std::string& dir() const { return dir_; }

 private:
  static inline int counter_ = 0;
  std::string dir_;
};

TEST(MemoryMonitor, ReadsMeminfo) {
  FakeRoot root;
  root.write("proc/meminfo", "MemTotal:       1000 kB\nMemFree:  100 kB\nMemAvailable:    250 kB\n");
  MemoryMonitor mon(root.dir());
  auto r = mon.read_host();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->limit_bytes, 1000u * 1024);
  EXPECT_EQ(r->used_bytes, 750u * 1024);
  EXPECT_EQ(r->source, "meminfo");
}

TEST(MemoryMonitor, CgroupV2LimitWinsWhenTighter) {
  FakeRoot root;
  root.write("proc/meminfo", "MemTotal: 1000000 kB\nMemAvailable: 900000 kB\n");
  root.write("sys/fs/cgroup/memory.max", "1000\n");
  root.write("sys/fs/cgroup/memory.current", "950\n");
  root.write("sys/fs/cgroup/memory.stat", "anon 800\nfile 150\ninactive_file 50\nactive_file 100\n");
  MemoryMonitor mon(root.dir());
  auto r = mon.read_host();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->source, "cgroup-v2");
  EXPECT_EQ(r->used_bytes, 900u);  // working set: usage minus inactive file pages
  EXPECT_EQ(r->limit_bytes, 1000u);
}

TEST(MemoryMonitor, UnlimitedCgroupFallsBackToMeminfo) {
  FakeRoot root;
  root.write("proc/meminfo", "MemTotal: 1000 kB\nMemAvailable: 500 kB\n");
  root.write("sys/fs/cgroup/memory.max", "max\n");
  root.write("sys/fs/cgroup/memory.current", "950\n");
  root.write("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  root.write("sys/fs/cgroup/memory/memory.usage_in_bytes", "100\n");
  MemoryMonitor mon(root.dir());
  EXPECT_EQ(mon.read_host()->source, "meminfo");
}

TEST(MemoryMonitor, CgroupV1) {
  FakeRoot root;
  root.write("sys/fs/cgroup/memory/memory.limit_in_bytes", "2000\n");
  root.write("sys/fs/cgroup/memory/memory.usage_in_bytes", "1500\n");
  root.write("sys/fs/cgroup/memory/memory.stat", "cache 600\ntotal_inactive_file 500\n");
  MemoryMonitor mon(root.dir());
  auto r = mon.read_host();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->source, "cgroup-v1");
  EXPECT_EQ(r->used_bytes, 1000u);
}

TEST(MemoryMonitor, AddedSourceWithMorePressureWins) {
  FakeRoot root;
  root.write("proc/meminfo", "MemTotal: 1000 kB\nMemAvailable: 900 kB\n");
  MemoryMonitor mon(root.dir(), std::chrono::milliseconds(0));
  mon.add_source("gpu", [] { return MemoryReading{95, 100, ""}; });
  auto r = mon.reading();
  EXPECT_EQ(r.source, "gpu");
  EXPECT_DOUBLE_EQ(r.fraction(), 0.95);
}

TEST(Admission, MemoryPressureRefusesWith503UntilItDrops) {
  FakeRoot root;
  root.write("proc/meminfo", "MemTotal: 1000 kB\nMemAvailable: 100 kB\n");  // 90% used
  auto mon = std::make_shared<MemoryMonitor>(root.dir(), std::chrono::milliseconds(0));
  Admission adm({.memory_pressure_threshold = 0.86}, mon);
  EXPECT_EQ(status_of([&] { adm.enter(1, [] {}); }), 503);
  EXPECT_EQ(adm.stats().rejected_memory, 1u);
  root.write("proc/meminfo", "MemTotal: 1000 kB\nMemAvailable: 500 kB\n");
  EXPECT_EQ(status_of([&] { adm.enter(1, [] {}); }), 0);
}

}  // namespace
}  // namespace moeserve::server
