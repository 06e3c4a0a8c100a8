#include "deploy/local_cluster.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "deploy/http_get.h"
#include "deploy/metric_names.h"

namespace moeserve::deploy {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string state_path(const std::string& dir) {
  return (fs::path(dir) / "cluster.json").string();
}

std::string read_stat(int pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string s;
  std::getline(in, s);
  return s;
}

// Fields after the command name (which may hold spaces and parentheses): state is the 3rd field overall.
std::vector<std::string> stat_fields(int pid) {
  std::string s = read_stat(pid);
  auto close = s.rfind(')');
  if (close == std::string::npos) return {};
  std::istringstream in(s.substr(close + 2));
  std::vector<std::string> f;
  for (std::string x; in >> x;) f.push_back(x);
  return f;  // f[0] = state (field 3), f[19] = starttime (field 22)
}

bool port_free(const std::string& host, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = host == "0.0.0.0" ? htonl(INADDR_ANY) : htonl(INADDR_LOOPBACK);
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

// Starts argv with stdout/stderr going to `log`, in its own session (a closed terminal does not take the
// cluster down; `cluster down` does).
int spawn(const std::vector<std::string>& argv, const std::string& log) {
  int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  check(out >= 0, "cannot write {}", log);
  pid_t pid = ::fork();
  check(pid >= 0, "fork failed: {}", std::strerror(errno));
  if (pid == 0) {
    ::setsid();
    int in = ::open("/dev/null", O_RDONLY);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(out, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    std::string msg = fmt::format("cannot run {}: {}\n", argv[0], std::strerror(errno));
    (void)!::write(2, msg.data(), msg.size());
    ::_exit(127);
  }
  ::close(out);
  return pid;
}

std::string log_tail(const std::string& path, size_t lines = 20) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string l; std::getline(in, l);) all.push_back(l);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
    out += "    " + all[i] + "\n";
  return out.empty() ? "    (empty)\n" : out;
}

void save(const LocalClusterState& s) {
  std::ofstream out(state_path(s.dir), std::ios::trunc);
  out << s.to_json().dump(2) << "\n";
  check(bool(out), "cannot write {}", state_path(s.dir));
}

// Waits for /health 200; fails early when the process exits.
void wait_healthy(const LocalProcess& p, const std::string& host, Clock::time_point deadline) {
  while (Clock::now() < deadline) {
    int status = 0;
    if (::waitpid(p.pid, &status, WNOHANG) == p.pid)
      fail("{} exited ({}) before it was ready; the end of {}:\n{}", p.name,
           WIFEXITED(status) ? fmt::format("exit code {}", WEXITSTATUS(status))
                             : fmt::format("signal {}", WTERMSIG(status)),
           p.log, log_tail(p.log));
    if (http_get(host, p.port, "/health", 2.0).status == 200) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  fail("{} did not report healthy on {}:{} in time; the end of {}:\n{}", p.name, host, p.port, p.log,
       log_tail(p.log));
}

// Sums of each metric over its label sets, from Prometheus text.
std::map<std::string, double> scrape(const std::string& text) {
  std::map<std::string, double> sums;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string::npos) continue;
    size_t value_at = line[name_end] == '{' ? line.find("} ", name_end) : name_end;
    if (value_at == std::string::npos) continue;
    value_at = line.find_first_not_of("} ", value_at);
    if (value_at == std::string::npos) continue;
    sums[line.substr(0, name_end)] += std::strtod(line.c_str() + value_at, nullptr);
  }
  return sums;
}

// How many of a stage's processes are alive (our own children, from a `cluster up` that failed or runs in
// the foreground, are reaped first).
int alive_count(const std::vector<const LocalProcess*>& stage) {
  int alive = 0;
  for (const auto* p : stage) {
    ::waitpid(p->pid, nullptr, WNOHANG);
    alive += process_alive(p->pid, p->start_time);
  }
  return alive;
}

// Waits up to `seconds` until `done`; returns whether it came.
template <class Done>
bool wait_for(double seconds, Done done) {
  auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  while (!done() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return done();
}

void signal_alive(const std::vector<const LocalProcess*>& stage, int sig) {
  for (const auto* p : stage)
    if (process_alive(p->pid, p->start_time)) ::kill(p->pid, sig);
}

// SIGTERM drains; a second SIGTERM is each process's deadline now (its streams end with finish_reason
// "abort" and [DONE], as at its own deadline); SIGKILL only for a process that has not exited `kill_after`
// seconds after that.
void stop_stage(const std::vector<const LocalProcess*>& stage, const std::string& host, double timeout,
                double kill_after) {
  auto exited = [&] { return alive_count(stage) == 0; };
  signal_alive(stage, SIGTERM);
  if (wait_for(timeout, exited)) return;
  // Two SIGTERMs pending at once are one: the second goes once the first has taken effect (/health no longer
  // answers 200: refused by the router, 503 from a server).
  wait_for(kill_after, [&] {
    for (const auto* p : stage)
      if (process_alive(p->pid, p->start_time) && http_get(host, p->port, "/health", 1.0).status == 200)
        return false;
    return true;
  });
  signal_alive(stage, SIGTERM);
  if (wait_for(kill_after, exited)) return;
  signal_alive(stage, SIGKILL);
  wait_for(5, exited);
}

// A flag given with --serve-arg / --route-arg wins over the one cluster up adds (CLI11 refuses a flag twice).
void add_unless_given(std::vector<std::string>& argv, const std::vector<std::string>& given,
                      const std::string& flag, const std::string& value) {
  for (const auto& a : given)
    if (a == flag || a.starts_with(flag + "=")) return;
  argv.insert(argv.end(), {flag, value});
}

}  // namespace

uint64_t process_start_time(int pid) {
  auto f = stat_fields(pid);
  return f.size() > 19 ? std::stoull(f[19]) : 0;
}

bool process_alive(int pid, uint64_t start_time) {
  auto f = stat_fields(pid);
  if (f.size() <= 19 || f[0] == "Z" || f[0] == "X") return false;
  return start_time == 0 || std::stoull(f[19]) == start_time;
}

json LocalClusterState::to_json() const {
  json procs = json::array();
  for (const auto& p : processes)
    procs.push_back({{"name", p.name},
                     {"role", p.role},
                     {"pid", p.pid},
                     {"start_time", p.start_time},
                     {"port", p.port},
                     {"log", p.log}});
  return {{"dir", dir},       {"model", model},     {"host", host},
          {"binary", binary}, {"processes", procs}, {"shutdown_timeout", shutdown_timeout}};
}

LocalClusterState LocalClusterState::from_json(const json& j) {
  LocalClusterState s;
  s.dir = j.at("dir");
  s.model = j.at("model");
  s.host = j.at("host");
  s.binary = j.at("binary");
  s.shutdown_timeout = j.value("shutdown_timeout", s.shutdown_timeout);  // absent in clusters started before
  for (const auto& p : j.at("processes"))
    s.processes.push_back(
        {p.at("name"), p.at("role"), p.at("pid"), p.at("start_time"), p.at("port"), p.at("log")});
  return s;
}

LocalClusterState LocalClusterState::load(const std::string& dir) {
  std::ifstream in(state_path(dir));
  check(bool(in), "no local cluster in {} (start one with `moeserve cluster up --local N`)", dir);
  try {
    return from_json(json::parse(in));
  } catch (const json::exception& e) {
    fail("{} is damaged ({}); stop the processes listed in it by hand and delete it", state_path(dir),
         e.what());
  }
}

LocalClusterState cluster_up(const LocalClusterOptions& o) {
  check(o.nodes >= 1 && o.nodes <= 64, "cluster up: --local must be between 1 and 64");
  check(o.shutdown_timeout >= 0, "cluster up: --shutdown-timeout must not be negative");
  fs::create_directories(o.dir);
  if (fs::exists(state_path(o.dir))) {
    LocalClusterState old = LocalClusterState::load(o.dir);
    for (const auto& p : old.processes)
      check(
          !process_alive(p.pid, p.start_time),
          "a local cluster is already running from {} ({} is pid {}); `moeserve cluster down --dir {}` first",
          o.dir, p.name, p.pid, o.dir);
  }
  std::vector<int> ports;
  for (int i = 0; i < o.nodes; ++i) ports.push_back(o.base_port + i);
  ports.push_back(o.router_port);
  for (int port : ports)
    check(port_free(o.host, port),
          "cluster up: port {} on {} is in use; choose other ports with --base-port / --router-port", port,
          o.host);

  LocalClusterState s;
  s.dir = o.dir;
  s.model = o.served_model_name.empty() ? o.model : o.served_model_name;
  s.host = o.host;
  s.binary = o.binary.empty() ? fs::read_symlink("/proc/self/exe").string() : o.binary;
  s.shutdown_timeout = o.shutdown_timeout;
  auto deadline = Clock::now() +
                  std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.start_timeout));
  try {
    for (int i = 0; i < o.nodes; ++i) {
      LocalProcess p{fmt::format("node-{}", i + 1),
                     "server",
                     0,
                     0,
                     o.base_port + i,
                     (fs::path(o.dir) / fmt::format("node-{}.log", i + 1)).string()};
      std::vector<std::string> argv = {s.binary, "serve",  "--model", o.model,  "--served-model-name",
                                       s.model,  "--host", o.host,    "--port", std::to_string(p.port)};
      // The demo model is tiny: 0.05 GiB holds 100 000 tokens of its KV, and N servers on one machine should
      // not each take the server's default share of its memory (nor the time to allocate it).
      double cache_gb = o.cache_memory_gb >= 0 ? o.cache_memory_gb : o.model == "demo" ? 0.05 : -1;
      if (cache_gb > 0) argv.insert(argv.end(), {"--cache-memory-gb", fmt::format("{}", cache_gb)});
      add_unless_given(argv, o.serve_args, "--shutdown-timeout", fmt::format("{}", o.shutdown_timeout));
      argv.insert(argv.end(), o.serve_args.begin(), o.serve_args.end());
      p.pid = spawn(argv, p.log);
      p.start_time = process_start_time(p.pid);
      s.processes.push_back(p);
      save(s);  // recorded at once: `cluster down` can stop a half-started cluster
    }
    for (const auto& p : s.processes) wait_healthy(p, o.host, deadline);

    LocalProcess r{"router", "router", 0, 0, o.router_port, (fs::path(o.dir) / "router.log").string()};
    std::vector<std::string> argv = {
        s.binary, "route", "--host", o.host, "--port", std::to_string(o.router_port), "--policy", o.policy};
    add_unless_given(argv, o.route_args, "--shutdown-timeout", fmt::format("{}", o.shutdown_timeout));
    for (const auto& p : s.processes) {
      argv.push_back("--backend");
      argv.push_back(fmt::format("http://{}:{}", o.host, p.port));
    }
    argv.insert(argv.end(), o.route_args.begin(), o.route_args.end());
    r.pid = spawn(argv, r.log);
    r.start_time = process_start_time(r.pid);
    s.processes.push_back(r);
    save(s);
    wait_healthy(r, o.host, deadline);
  } catch (const Error&) {
    cluster_down(o.dir, {.timeout = 10});
    throw;
  }
  return s;
}

std::vector<ProcessStatus> cluster_status(const LocalClusterState& s) {
  std::vector<ProcessStatus> out;
  for (const auto& p : s.processes) {
    ProcessStatus st;
    st.process = p;
    st.alive = process_alive(p.pid, p.start_time);
    if (!st.alive) {
      st.state = "exited";
      out.push_back(st);
      continue;
    }
    HttpResponse h = http_get(s.host, p.port, "/health", 2.0);
    st.state = h.status == 200 ? "ready"
               : h.status == 0 ? "starting"
                               : fmt::format("unhealthy (HTTP {})", h.status);
    if (p.role == "server") {
      HttpResponse m = http_get(s.host, p.port, "/metrics", 2.0);
      if (m.status == 200) {
        auto v = scrape(m.body);
        auto get = [&](const char* name) { return v.count(name) ? v[name] : -1.0; };
        st.running = get(metric::kRequestsRunning);
        st.waiting = get(metric::kRequestsWaiting);
        st.kv_usage = get(metric::kKvUsage);
        double q = get(metric::kPrefixQueries), hits = get(metric::kPrefixHits);
        st.cache_hit_rate = q > 0 ? hits / q : q == 0 ? 0 : -1;
      }
    }
    out.push_back(st);
  }
  return out;
}

std::string format_status(const LocalClusterState& s, const std::vector<ProcessStatus>& status) {
  auto num = [](double v, const char* f) {
    return v < 0 ? std::string("-") : fmt::format(fmt::runtime(f), v);
  };
  std::string out = fmt::format("{:<9} {:<18} {:>7} {:<20} {:>9} {:>8} {:>6} {:>10}\n", "name", "url", "pid",
                                "state", "in-flight", "waiting", "kv", "cache hit");
  for (const auto& st : status) {
    const auto& p = st.process;
    out += fmt::format("{:<9} {:<18} {:>7} {:<20} {:>9} {:>8} {:>6} {:>10}\n", p.name,
                       fmt::format("{}:{}", s.host, p.port), p.pid, st.state, num(st.running, "{:.0f}"),
                       num(st.waiting, "{:.0f}"),
                       st.kv_usage < 0 ? "-" : fmt::format("{:.0f}%", st.kv_usage * 100),
                       st.cache_hit_rate < 0 ? "-" : fmt::format("{:.0f}%", st.cache_hit_rate * 100));
  }
  for (const auto& p : s.processes)
    if (p.role == "router")
      out += fmt::format("\nOpenAI base URL: http://{}:{}/v1   (model \"{}\")\n", s.host, p.port, s.model);
  out += fmt::format("logs: {}/*.log\n", s.dir);
  return out;
}

int cluster_down(const std::string& dir, const ClusterDownOptions& options) {
  LocalClusterState s = LocalClusterState::load(dir);
  double timeout = options.timeout >= 0 ? options.timeout : s.shutdown_timeout;
  // The router first: once it has exited no request reaches the servers, and each of its streams has ended
  // (its connections to the servers closed, which cancels what they still generated for it).
  std::vector<const LocalProcess*> routers, servers;
  for (const auto& p : s.processes) (p.role == "router" ? routers : servers).push_back(&p);
  stop_stage(routers, s.host, timeout, options.kill_after);
  stop_stage(servers, s.host, timeout, options.kill_after);
  std::vector<const LocalProcess*> all = routers;
  all.insert(all.end(), servers.begin(), servers.end());
  int left = alive_count(all);
  if (left == 0) fs::remove(state_path(dir));
  return left;
}

}  // namespace moeserve::deploy
