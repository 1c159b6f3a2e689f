// ddprun-bench rendezvous: multi-node rendezvous, ddprun against torchrun's c10d backend, same
// run. Every "node" is an agent process on this machine with its own loopback address.
//
// 1. form+run: N agents (--nnodes=N, nproc 1, PROGRAM `true`) from the first spawn until every
//    agent has exited 0: connect, rendezvous, run, exit barrier. N = 4, 16, 64. Its "form" row:
//    from the first spawn until the last agent logged its round closed (it knows its rank).
// 2. recovery: N agents (--nnodes=N-1:N) run `sleep`; one agent's whole process group is
//    SIGKILLed (a machine lost); timed until every survivor's new worker has started.
//    Heartbeat 1 s x 3 on both sides, so the bound is 3 s + 200 ms.
// torchrun is Debian's 1.13 through bench/torchrun_wrapper.py (--monitor_interval=0.1, is_host
// on agent 0). Prints a table and writes bench/results/rendezvous.csv.
#include <utility>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <cerrno>
#include <fcntl.h>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <poll.h>
#include <spawn.h>
#include <sstream>
#include <sys/inotify.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <thread>
#include <tuple>
#include <unistd.h>

#include "bench/paths.h"
#include "bench/registry.h"
#include "bench/rendezvous_simulate.h"
#include "bench/rendezvous_peers.h"
#include "rendezvous/dynamic_rendezvous.h"
#include "rendezvous/node_address.h"
#include "tests/etcd/etcd_cluster.h"  // a local etcd cluster, as the tests start one

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

// Where agents' stderr goes: one file per agent, shown when a run fails, kept with --keep-logs.
// By default on /dev/shm (tmpfs) where there is one, else /tmp: each file is the harness's, not
// the agent's, yet it is created in the agent's process (before exec) and deleted after the run;
// on ext4 every file created within 30 s of a deletion skips the recently deleted inodes of its
// block group (ext4's find_inode_bit), so back-to-back runs of 256 agents made each agent's
// file creations scan the hundreds the run before deleted -- a cost of this harness, not of
// the agents (docs/rendezvous.md: what bounds the agents' start).
std::string gKeepLogs;  // --keep-logs DIR

std::string logFile(int i) {
  if (!gKeepLogs.empty()) return gKeepLogs + "/agent" + std::to_string(i) + ".log";
  static const std::string dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  return dir + "/ddprun-bench-rdzv-" + std::to_string(::getpid()) + "-agent" + std::to_string(i) + ".log";
}

void showLogs(int n) {
  for (int i = 0; i < n; ++i) {
    std::ifstream in(logFile(i));
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    std::fprintf(stderr, "---- agent %d (%s), last lines:\n", i, logFile(i).c_str());
    for (size_t k = lines.size() > 8 ? lines.size() - 8 : 0; k < lines.size(); ++k)
      std::fprintf(stderr, "  %s\n", lines[k].c_str());
  }
}

void removeLogs(int n) {
  if (!gKeepLogs.empty()) return;
  for (int i = 0; i < n; ++i) ::unlink(logFile(i).c_str());
}

// The agents started and not reaped, by process group (each agent leads one): whatever ends the
// bench -- a signal (SIGTERM from a `timeout`, SIGINT, SIGHUP), an exception, a return -- kills
// them first (AgentReaper, onEndingSignal), so that no agent outlives a bench that gave up. In
// their own process groups they get no signal meant for the bench's, and orphaned they went on
// (issue 20: agents of a failed 256-agent run still alive minutes later). Lock-free slots: the
// signal handler reads them.
constexpr size_t kMaxAgents = 4096;
std::atomic<pid_t> gAgents[kMaxAgents];

void trackAgent(pid_t p) {
  for (auto& slot : gAgents) {
    pid_t free = 0;
    if (slot.compare_exchange_strong(free, p)) return;
  }
}

void untrackAgent(pid_t p) {
  for (auto& slot : gAgents) {
    pid_t mine = p;
    if (slot.compare_exchange_strong(mine, 0)) return;
  }
}

void killTrackedAgents() {  // async-signal-safe
  for (auto& slot : gAgents) {
    const pid_t p = slot.load();
    if (p > 0) ::kill(-p, SIGKILL);
  }
}

// A spawn in progress on the main thread while the handler runs on another (the watchdog's):
// the handler waits for it to be tracked, and no spawn starts once the bench is ending (each
// sees the other's flag: both sequentially consistent).
std::atomic<int> gSpawning{0};
std::atomic<bool> gEnding{false};

extern "C" void onEndingSignal(int sig) {
  gEnding = true;
  const timespec ms{0, 1'000'000};
  for (int i = 0; i < 5'000 && gSpawning.load() > 0; ++i) ::nanosleep(&ms, nullptr);
  killTrackedAgents();
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// Kills the tracked agents when the bench's run ends by an exception or a return, and installs
// onEndingSignal meanwhile.
struct AgentReaper {
  AgentReaper() {
    for (int sig : {SIGTERM, SIGINT, SIGHUP}) ::signal(sig, onEndingSignal);
  }
  ~AgentReaper() { killTrackedAgents(); }
  AgentReaper(const AgentReaper&) = delete;
  AgentReaper& operator=(const AgentReaper&) = delete;
};

// Starts argv in a process group of its own, stdout discarded, stderr to logFile(i),
// BENCH_AGENT=i in its env; tracked until reaped.
std::string gAgentTmpdir;  // --agent-tmpdir DIR: the agents' TMPDIR (their run directories)

pid_t spawnAgent(const std::vector<std::string>& argv, int i) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    if (!gAgentTmpdir.empty() && std::strncmp(*e, "TMPDIR=", 7) == 0) continue;
    env.emplace_back(*e);
  }
  if (!gAgentTmpdir.empty()) env.push_back("TMPDIR=" + gAgentTmpdir);
  env.push_back("BENCH_AGENT=" + std::to_string(i));
  env.push_back("DDPRUN_LOG_LEVEL=info");
  std::vector<char*> a, e;
  for (auto& s : const_cast<std::vector<std::string>&>(argv)) a.push_back(s.data());
  a.push_back(nullptr);
  for (auto& s : env) e.push_back(s.data());
  e.push_back(nullptr);
  // The ending signals wait until the new agent is tracked: one arriving mid-spawn would kill
  // the tracked agents but not this one. Blocked on this thread (its handler would wait for
  // this spawn), and on another thread the handler waits for gSpawning. The agent itself
  // starts with the mask as it was.
  sigset_t ending, before;
  sigemptyset(&ending);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&ending, sig);
  ::pthread_sigmask(SIG_BLOCK, &ending, &before);
  ++gSpawning;
  if (gEnding) {
    --gSpawning;
    ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
    throw std::runtime_error("not starting agent " + std::to_string(i) + ": the bench is ending");
  }
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setsigmask(&attr, &before);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, logFile(i).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, a[0], &fa, &attr, a.data(), e.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc == 0) trackAgent(pid);
  --gSpawning;
  ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  // Never a pid of -1 in the list: kill(-pid) would then signal process 1.
  if (rc != 0)
    throw std::runtime_error("cannot start agent " + std::to_string(i) + " (" + argv[0] +
                             "): " + std::strerror(rc));
  return pid;
}

void killAll(const std::vector<pid_t>& pids) {
  for (pid_t p : pids) ::kill(-p, SIGKILL);
  for (pid_t p : pids) {
    ::waitpid(p, nullptr, 0);
    untrackAgent(p);
  }
}

// Every run its own id: an etcd cluster keeps a finished job's keys (a reused id is refused).
std::string runId(const char* scenario, int n) {
  static int runs = 0;
  return scenario + std::to_string(n) + "-" + std::to_string(::getpid()) + "-" + std::to_string(runs++);
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Result {
  std::optional<double> seconds;
  std::string note;
  std::optional<double> cpu;  // form: CPU seconds of every agent, worker and guard of the run
  // form: from the first spawn until the last agent knew its rank (its "round 0 closed" log
  // line); ddprun only (torchrun's agents do not log it).
  std::optional<double> formed;
};

// Milliseconds since local midnight of a ddprun log line "[ddprun I HH:MM:SS.mmm ...] round 0
// closed: ..." (base/log.cpp's format), or nullopt when the file has no such line.
std::optional<int64_t> roundClosedAt(const std::string& file) {
  std::ifstream in(file);
  for (std::string l; std::getline(in, l);) {
    if (l.find("] round 0 closed: ") == std::string::npos) continue;
    int h = 0, m = 0, sec = 0, ms = 0;
    if (std::sscanf(l.c_str(), "[ddprun %*c %d:%d:%d.%d", &h, &m, &sec, &ms) != 4) return std::nullopt;
    return ((h * 60 + m) * 60 + sec) * 1000LL + ms;
  }
  return std::nullopt;
}

// The local time of day of `t` in milliseconds, as log lines print it.
int64_t msOfDay(std::chrono::system_clock::time_point t) {
  const std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  ::localtime_r(&secs, &tm);
  const auto ms = std::chrono::duration_cast<Millis>(t.time_since_epoch()).count() % 1000;
  return ((tm.tm_hour * 60 + tm.tm_min) * 60 + tm.tm_sec) * 1000LL + ms;
}

etcdtest::EtcdCluster* gCluster = nullptr;  // --backend etcd-v3: its members' CPU counts too

double childrenCpuSeconds() {
  rusage ru{};
  ::getrusage(RUSAGE_CHILDREN, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6 +
         (gCluster ? gCluster->cpuSeconds() : 0.0);
}

// Scenario 1: from the first spawn until every agent has exited 0 (a watchdog kills the rest
// at the cap).
Result form(const Peer& peer, int n, Millis cap) {
  const uint16_t port = ddprun::rendezvous::pickFreePort();
  const std::string id = runId("form", n);
  std::vector<pid_t> pids;
  const double cpu0 = childrenCpuSeconds();  // agents reap their workers: all of it lands here
  const auto t0 = Clock::now();
  const int64_t t0OfDay = msOfDay(std::chrono::system_clock::now());
  try {
    for (int i = 0; i < n; ++i)
      pids.push_back(spawnAgent(peer.argv(i, n, n, port, id, {"true"}), i));
  } catch (const std::exception&) {
    killAll(pids);  // the agents already started
    throw;
  }
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false, capped = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, cap, [&] { return finished; })) {
      capped = true;
      for (pid_t p : pids) ::kill(-p, SIGKILL);
    }
  });
  int failed = 0;
  for (size_t exited = 0; exited < pids.size();) {
    int status = 0;
    const pid_t p = ::waitpid(-1, &status, 0);
    if (p < 0 && errno == EINTR) continue;
    if (p < 0) {  // not a time: the agents not reaped are counted as failed
      failed += static_cast<int>(pids.size() - exited);
      break;
    }
    if (std::find(pids.begin(), pids.end(), p) == pids.end()) continue;
    untrackAgent(p);
    ++exited;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  const auto t1 = Clock::now();
  {
    std::lock_guard<std::mutex> g(mu);
    finished = true;
  }
  cv.notify_all();
  watchdog.join();
  if (capped || failed) showLogs(n);
  // The round formed when the last agent logged it closed (at millisecond resolution).
  std::optional<double> formed;
  for (int i = 0; i < n; ++i) {
    const auto at = roundClosedAt(logFile(i));
    if (!at) {
      formed.reset();
      break;
    }
    int64_t since = *at - t0OfDay;
    if (since < -43'200'000) since += 86'400'000;  // past midnight
    formed = std::max(formed.value_or(0.0), since / 1000.0);
  }
  removeLogs(n);
  if (capped) return {std::nullopt, "not done within " + std::to_string(cap.count() / 1000) + " s"};
  if (failed) return {std::nullopt, std::to_string(failed) + " agents failed"};
  return {seconds(t1 - t0), "", childrenCpuSeconds() - cpu0, formed};
}

// Lines "AGENT WORLD PID" appended by each worker at its start, watched with inotify.
class StartLog {
 public:
  explicit StartLog(std::string path) : path_(std::move(path)) {
    std::ofstream(path_).close();
    fd_ = ::inotify_init1(IN_CLOEXEC);
    ::inotify_add_watch(fd_, path_.c_str(), IN_MODIFY);
  }
  ~StartLog() { ::close(fd_); }
  // Waits until `count` workers with world size `world` (not of agent `except`) have started.
  bool waitFor(int world, int count, int except, Clock::time_point deadline) {
    for (;;) {
      if (this->count(world, except) >= count) return true;
      const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) > 0) {
        char buf[4096];
        (void)!::read(fd_, buf, sizeof buf);
      }
    }
  }
  int count(int world, int except) {
    int c = 0;
    for (const auto& [agent, w, pid] : lines())
      if (w == world && agent != except) ++c;
    return c;
  }
  std::vector<std::tuple<int, int, pid_t>> lines() {
    std::ifstream in(path_);
    std::vector<std::tuple<int, int, pid_t>> out;
    int agent = 0, w = 0;
    pid_t pid = 0;
    while (in >> agent >> w >> pid) out.emplace_back(agent, w, pid);
    return out;
  }
  // Kills the workers of `agent` (-1: of every agent); torchrun's run in sessions of their own.
  void killWorkers(int agent) {
    for (const auto& [a, w, pid] : lines())
      if (agent < 0 || a == agent) ::kill(pid, SIGKILL);
  }

 private:
  std::string path_;
  int fd_;
};

// Scenario 2: SIGKILL one agent's process group; time until every survivor's new worker runs.
Result recovery(const Peer& peer, int n, Millis cap) {
  const Millis hbTimeout = peer.detection;
  const uint16_t port = ddprun::rendezvous::pickFreePort();
  const std::string id = runId("recover", n);
  const std::string logPath = "/tmp/ddprun-bench-rdzv-" + std::to_string(::getpid()) + ".log";
  StartLog log(logPath);
  // Both launchers expand $-templates in PROGRAM's arguments ("$$" is "$"): sh gets $$ = pid.
  const std::vector<std::string> worker = {
      "sh", "-c",
      "echo \"$$BENCH_AGENT $$GROUP_WORLD_SIZE $$$$\" >> " + logPath + "; exec sleep 1000"};
  std::vector<pid_t> pids;
  try {
    for (int i = 0; i < n; ++i)
      pids.push_back(spawnAgent(peer.argv(i, n, n - 1, port, id, worker), i));
  } catch (const std::exception&) {
    killAll(pids);  // the agents already started
    throw;
  }
  Result r;
  if (!log.waitFor(n, n, -1, Clock::now() + Millis(180'000))) {
    r.note = "the first round of " + std::to_string(n) + " did not start";
    showLogs(n);
  } else {
    const int victim = n - 1;  // never the store host (agent 0)
    const auto t0 = Clock::now();
    ::kill(-pids[victim], SIGKILL);  // the agent and, with its workers, the whole "machine"
    log.killWorkers(victim);
    if (log.waitFor(n - 1, n - 1, victim, t0 + cap)) {
      r.seconds = seconds(Clock::now() - t0);
      if (*r.seconds > seconds(hbTimeout + Millis(200)))
        r.note = (peer.name == "ddprun" ? "" : peer.name + " ") + "over the bound";
    } else {
      r.note = "survivors not restarted within " + std::to_string(cap.count() / 1000) +
               " s (cf. pytorch#111646)";
    }
  }
  // A failed ddprun run shows its agents' logs; one merely over the bound keeps them and says
  // where, rather than printing 8 lines for each of up to 64 agents.
  const bool overBound = r.note.find("over the bound") != std::string::npos;
  if (!r.seconds && peer.name != "torchrun") showLogs(n);
  killAll(pids);
  log.killWorkers(-1);
  ::unlink(logPath.c_str());
  if (overBound) {
    std::fprintf(stderr, "agents' logs of the run over the bound: %s ... %s\n",
                 logFile(0).c_str(), logFile(n - 1).c_str());
  } else {
    removeLogs(n);
  }
  return r;
}

std::string fmt(const Result& r) {
  if (!r.seconds) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.3f s", *r.seconds);
  return b;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int benchRendezvous(int argc, char** argv) {
  AgentReaper reaper;
  CLI::App app{"ddprun-bench rendezvous: multi-node rendezvous, ddprun vs torchrun c10d, or "
               "ddprun on etcd-v3 vs ddprun on c10d"};
  std::vector<int> sizes = {4, 16, 64};
  int repeat = 3;
  bool noTorchrun = false;
  std::string python = "/usr/bin/python3";
  std::string backend = "c10d";
  std::string csv;
  app.add_option("--sizes", sizes, "numbers of agents")->delimiter(',');
  app.add_option("--repeat", repeat, "runs of the form scenario per size (median)");
  app.add_option("--backend", backend,
                 "c10d: ddprun vs torchrun 1.13; etcd-v3: ddprun on a 3-member etcd cluster "
                 "started here vs ddprun on c10d (with --simulate: the simulated agents on a "
                 "private one-member etcd instead of a ddprun-store)")
      ->check(CLI::IsMember({"c10d", "etcd-v3"}));
  app.add_flag("--no-torchrun", noTorchrun, "ddprun only");
  app.add_option("--torch-python", python, "python3 with torch (Debian's python3-torch)");
  app.add_option("--csv", csv, "where to write the results (default: bench/results/"
                               "rendezvous.csv, rendezvous_etcd.csv for etcd-v3)");
  app.add_option("--keep-logs", gKeepLogs, "keep each agent's log in this directory (last run)");
  app.add_option("--agent-tmpdir", gAgentTmpdir,
                 "the agents' TMPDIR, where each makes its run directory (default: inherited; "
                 "e.g. /dev/shm: tmpfs, to tell the file system's cost from the rest)");
  std::string rdzvConf;
  app.add_option("--rdzv-conf", rdzvConf,
                 "more --rdzv-conf settings for ddprun's agents on c10d, after heartbeat=1,"
                 "missed_heartbeats=3 (e.g. rank_order=arrival)");
  std::string only;
  app.add_option("--only", only, "run one scenario")->check(CLI::IsMember({"form", "recovery"}));
  ddprun::bench::SimulateOptions sim;
  int64_t spreadMs = 200, capS = 120;
  bool noPlot = false;
  app.add_option("--simulate", sim.sizes,
                 "instead: N agents simulated in this process against one ddprun-store, "
                 "for each N (e.g. 16,64,256,1024); writes rendezvous_simulate.csv and .png")
      ->delimiter(',');
  app.add_option("--seed", sim.seed, "--simulate: arrival times, nproc, the evicted agent");
  app.add_option("--spread-ms", spreadMs, "--simulate: arrivals spread uniformly over this");
  app.add_option("--cap", capS, "--simulate: seconds a phase may take; larger N are skipped after");
  app.add_option("--loops", sim.loops,
                 "--simulate: threads that run the simulated agents (fibers; agent i on thread "
                 "i % loops)")
      ->check(CLI::Range(1, 64));
  app.add_flag("--no-plot", noPlot, "--simulate: no PNG");
  int waiting = 0;
  app.add_option("--waiting", waiting,
                 "--simulate: W more agents arrive at the full round once it formed and wait on "
                 "its waiting list; the re-form after the eviction takes them in (MAX stays N)")
      ->check(CLI::Range(0, 100000));
  // The default is the rendezvous's (what a job gets without --rdzv-conf rank_order).
  std::string rankOrder =
      ddprun::rendezvous::DynamicRendezvousOptions{}.arrivalRanks ? "arrival" : "stable";
  app.add_option("--rank-order", rankOrder,
                 "--simulate --protocol agents: arrival (node ranks in slot order, constant "
                 "store work for every agent; the rendezvous's default) or stable (kept from "
                 "the round before: the closer reads every record)")
      ->check(CLI::IsMember({"arrival", "stable"}));
  bool noLeases = false;
  app.add_flag("--no-leases", noLeases,
               "--simulate --backend etcd-v3: the agents without their lease liveness (no "
               "lease, keep-alives or alive/ watch): the join's cost alone");
  std::string etcdTransport = "grpc";
  app.add_option("--etcd-transport", etcdTransport,
                 "--simulate --backend etcd-v3: grpc (HTTP/2, one connection per agent: the "
                 "default for http://) or gateway (the JSON gateway over HTTP/1.1, a connection "
                 "per watch)")
      ->check(CLI::IsMember({"grpc", "gateway"}));
  double leaseTtlS = 10;
  app.add_option("--lease-ttl", leaseTtlS,
                 "--simulate --backend etcd-v3: each agent's lease_ttl in seconds (keep-alives "
                 "every third of it; an agent whose keep-alives fail that long stops)")
      ->check(CLI::Range(1.0, 3600.0));
  std::string etcdDataParent = "/dev/shm";
  app.add_option("--etcd-data-parent", etcdDataParent,
                 "--simulate --backend etcd-v3: where etcd's data directory goes (default a "
                 "tmpfs: etcd 3.4 cannot turn off its fsyncs, which bound it on a disk)");
  std::string realCsv = ddprun::bench::resultsPath("rendezvous.csv");
  app.add_option("--real-csv", realCsv,
                 "--simulate: the agent-process results drawn on the plot (form+run rows)");
  app.add_option("--protocol", sim.protocols,
                 "--simulate: agents (DynamicRendezvous as the agents run it: slots form "
                 "rounds, the state log keeps the rest), log (the state-log join it replaced), "
                 "slots (the stand-alone join of rendezvous/scalable/), or several: log,agents")
      ->delimiter(',')
      ->check(CLI::IsMember({"log", "slots", "agents"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  sim.arrivalRanks = rankOrder == "arrival";
  sim.waiting = waiting;
  if (!sim.sizes.empty()) {
    sim.spread = Millis(spreadMs);
    sim.cap = Millis(capS * 1000);
    sim.storeBinary = ddprun::bench::programDir() + "/ddprun-store";
    sim.csv = csv;
    if (!noPlot) sim.png = ddprun::bench::resultsPath("rendezvous_simulate.png");
    sim.realCsv = realCsv;
    sim.backend = backend;
    sim.etcdLeases = !noLeases;
    sim.etcdGateway = etcdTransport == "gateway";
    sim.etcdDataParent = etcdDataParent;
    sim.etcdLeaseTtl = Millis(static_cast<int64_t>(leaseTtlS * 1000));
    return ddprun::bench::simulate(sim);
  }
  const bool etcd = backend == "etcd-v3";
  if (csv.empty()) {
    csv = ddprun::bench::resultsPath(etcd ? "rendezvous_etcd.csv" : "rendezvous.csv");
  }
  std::vector<Peer> peers = {ddprunPeer(rdzvConf)};
  std::string torchNote;
  std::unique_ptr<etcdtest::EtcdCluster> cluster;
  if (etcd) {
    if (!std::ifstream(etcdtest::kEtcdBinary).good()) {
      std::fprintf(stderr, "ddprun-bench rendezvous: %s not found (Debian etcd-server)\n",
                   etcdtest::kEtcdBinary);
      return 1;
    }
    cluster = std::make_unique<etcdtest::EtcdCluster>(3);
    gCluster = cluster.get();
    std::string endpoints;
    for (const auto& ep : cluster->endpoints()) endpoints += (endpoints.empty() ? "" : ",") + ep.text();
    std::printf("etcd cluster (3 members, data in %s): %s\n", cluster->dir().c_str(),
                endpoints.c_str());
    peers = {ddprunPeer(rdzvConf), ddprunEtcdPeer(endpoints)};  // c10d first: the ratio is etcd / c10d
    peers[0].name = "c10d";
  } else if (!noTorchrun) {
    if (std::system((python + " -c 'import torch.distributed' 2>/dev/null").c_str()) == 0)
      peers.push_back(torchrunPeer(python));
    else
      torchNote = "torchrun skipped: " + python + " has no torch";
  }
  const std::string first = peers[0].name, second = etcd ? peers[1].name : "torchrun";
  // (c10d mode keeps its historical column names: ddprun_s, torchrun_s, torchrun_over_ddprun.)
  auto column = [](std::string s) {
    for (auto& c : s) c = (c == '-' || c == ' ') ? '_' : c;
    return s;
  };
  std::ofstream out(csv);
  // Wall times depend on what else runs on the machine; CPU seconds do not (form rows: with
  // 2 cores, cpu / 2 is the wall time an idle machine could reach).
  const std::string a = column(first), b = column(second);
  out << "scenario,agents," << a << "_s," << b << "_s," << b << "_over_" << a << "," << a
      << "_cpu_s," << b << "_cpu_s,target,note\n";
  std::printf("%-9s %6s | %10s %10s %8s | %9s %9s | %s\n", "scenario", "agents", first.c_str(),
              second.c_str(), "ratio", ("cpu " + first.substr(0, 5)).c_str(),
              ("cpu " + second.substr(0, 5)).c_str(), "target; note");
  auto row = [&](const char* scenario, int n, const std::vector<Result>& rs,
                 const std::string& target) {
    const Result& d = rs[0];
    const Result t = rs.size() > 1 ? rs[1] : Result{std::nullopt, torchNote};
    std::string ratio = d.seconds && t.seconds ? std::to_string(*t.seconds / *d.seconds) : "-";
    if (ratio != "-") ratio = ratio.substr(0, ratio.find('.') + 2) + "x";
    std::string note;
    for (const auto& x : {d.note, t.note})
      if (!x.empty()) note += (note.empty() ? "" : "; ") + x;
    if (etcd) {  // etcd's members share the machine: say how busy it was
      std::ifstream loadavg("/proc/loadavg");
      std::string load;
      loadavg >> load;
      note += (note.empty() ? "" : "; ") + std::string("load ") + load;
    }
    auto cpu = [](const Result& r) {
      char b[32] = "-";
      if (r.cpu) std::snprintf(b, sizeof b, "%.3f s", *r.cpu);
      return std::string(b);
    };
    auto num = [](const std::optional<double>& v) { return v ? std::to_string(*v) : ""; };
    std::printf("%-9s %6d | %10s %10s %8s | %9s %9s | %s%s%s\n", scenario, n, fmt(d).c_str(),
                fmt(t).c_str(), ratio.c_str(), cpu(d).c_str(), cpu(t).c_str(), target.c_str(),
                target.empty() || note.empty() ? "" : "; ", note.c_str());
    std::fflush(stdout);
    out << scenario << "," << n << "," << num(d.seconds) << "," << num(t.seconds) << "," << ratio
        << "," << num(d.cpu) << "," << num(t.cpu) << ",\"" << target << "\",\"" << note
        << "\"\n";
  };
  for (int n : sizes) {
    if (only == "recovery") break;
    std::vector<Result> rs;
    for (const auto& p : peers) {
      const int runs = p.name == "torchrun" && n > 16 ? 1 : repeat;  // torchrun: ~1 s CPU per agent
      std::vector<double> times, cpus, formedTimes;
      Result last;
      for (int k = 0; k < runs; ++k) {
        last = form(p, n, Millis(300'000));
        if (!last.seconds) break;
        times.push_back(*last.seconds);
        cpus.push_back(*last.cpu);
        if (last.formed) formedTimes.push_back(*last.formed);
      }
      if (last.seconds) {
        last.seconds = median(times);
        last.cpu = median(cpus);
        last.formed.reset();
        if (formedTimes.size() == times.size()) last.formed = median(formedTimes);
      }
      rs.push_back(last);
    }
    // "form": until every agent knows its rank; "form+run": until every agent has exited (its
    // worker run, the exit barrier and the agent's end included).
    std::vector<Result> formed;
    for (const auto& r : rs) {
      formed.push_back({r.formed, r.formed || !r.seconds ? "" : "its agents log no round-closed line", {}, {}});
    }
    row("form", n, formed, n == 256 && !etcd ? "ddprun < 0.5 s" : "");
    row("form+run", n, rs, n == 64 && !etcd ? "ddprun < 0.3 s" : "");
  }
  for (int n : sizes) {
    if (only == "form") break;
    std::vector<Result> rs;
    for (const auto& p : peers) rs.push_back(recovery(p, n, p.detection + Millis(10'000)));
    row("recovery", n, rs,
        etcd ? "c10d <= 3.2 s (heartbeat timeout + 0.2 s); etcd-v3 <= 3.7 s (lease_ttl + "
               "etcd's 0.5 s expiry check + 0.2 s)"
             : "ddprun <= 3.2 s (heartbeat timeout + 0.2 s)");
  }
  std::printf("\nwritten: %s\n", csv.c_str());
  return 0;
}

}  // namespace

DDPRUN_BENCH("rendezvous", "multi-node rendezvous: N agents form+run, recovery after kill -9; vs torchrun c10d",
             benchRendezvous)
