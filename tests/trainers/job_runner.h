#pragma once
// Runs real ddprun / trainer processes for the end-to-end trainer tests.
//
// A Job is one child process in its own process group (tests/support's Process), its stdout and
// stderr captured in one file. wait() is bounded: on timeout the whole group is SIGKILLed and
// the test fails, so a hung job never outlives the test. After the job exits, whatever is left
// in its group is killed; the destructor kills a job that is still running.
// workerPid() finds a worker of a running launcher from outside (by /proc), so a test can kill it
// at an arbitrary moment, as a crash would: nothing in the trainer knows about tests.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "launcher/worker_lookup.h"
#include "rendezvous/tcp_store.h"
#include "tests/support/catch_torch.h"
#include "tests/support/process.h"

namespace ddprun::trainers::testing {

// Finding a rank's process from outside: launcher/worker_lookup.h (the benchmark uses the same).
using launcher::lookup::descendants;
using launcher::lookup::descendantWithEnv;
using launcher::lookup::environHas;
using launcher::lookup::procComm;
using launcher::lookup::rankTemplatePid;
using launcher::lookup::workerPid;

inline pid_t procParent(pid_t p) { return launcher::lookup::procStat(p).parent; }

// The agent's store as `worker` sees it: a client of the MASTER_ADDR and MASTER_PORT it was
// started with, for a test that reads or writes the workers' keys from outside, as a peer of the
// job would (these jobs have no token). Requests wait up to 10 s.
inline std::unique_ptr<rendezvous::TcpStore> workerStore(pid_t worker) {
  const std::string port = ddprun::testing::startEnv(worker, "MASTER_PORT");
  REQUIRE(!port.empty());
  REQUIRE(port != "?");
  return std::make_unique<rendezvous::TcpStore>(
      rendezvous::TcpStoreOptions{.host = ddprun::testing::startEnv(worker, "MASTER_ADDR"),
                                  .port = static_cast<uint16_t>(std::stoi(port)),
                                  .timeout = std::chrono::milliseconds(10'000),
                                  .connectTimeout = std::chrono::milliseconds(10'000),
                                  .tokenFromEnvironment = false});
}

// Hot spare `id` (ddprun --spares: DDPRUN_SPARE=<id>, no RANK), or -1. A spare that took a
// rank keeps this environment in /proc.
inline pid_t sparePid(pid_t launcher, int id, const std::string& program) {
  return descendantWithEnv(launcher, "DDPRUN_SPARE=" + std::to_string(id), program);
}

// The spare template exec'd as a process of its own (docs/recovery.md#spare-template:
// DDPRUN_SPARE_TEMPLATE_FD=5, the descriptor launcher/guarded_process.h passes), or -1.
inline pid_t spareTemplatePid(pid_t launcher, const std::string& program) {
  return descendantWithEnv(launcher, "DDPRUN_SPARE_TEMPLATE_FD=5", program);
}

// Hot spare `id` forked from the spare template (docs/recovery.md#spare-template), by its line
// "spare <id> (pid P) forked from the spare template" in the job's `output`, or -1. (Its
// /proc/<pid>/environ is the template's: sparePid() does not find it.)
inline pid_t forkedSparePid(const std::string& output, int id) {
  const std::string before = "spare " + std::to_string(id) + " (pid ";
  const std::string after = ") forked from the spare template";
  for (size_t at = output.find(before); at != std::string::npos;
       at = output.find(before, at + 1)) {
    const size_t digits = at + before.size();
    size_t end = digits;
    while (end < output.size() && output[end] >= '0' && output[end] <= '9') ++end;
    if (end > digits && output.compare(end, after.size(), after) == 0) {
      return static_cast<pid_t>(std::stol(output.substr(digits, end - digits)));
    }
  }
  return -1;
}

// The bundled mnist_mlp as the trainer tests run it: `examples` of Fashion-MNIST (the data set
// the trainer finds by itself), seed 11, SGD at lr 0.05, a checkpoint every 10 steps in
// <dir>/ckpt, the final weights in <dir>/final.pt, and with `metrics` the JSON lines in
// <dir>/metrics.jsonl. Every test that compares weights or samples runs these same settings.
struct MlpRun {
  std::string dir;
  int64_t batch = 16;  // per rank
  int epochs = 2;
  int64_t examples = 4096;
  uint64_t seed = 11;
  bool metrics = false;
};

inline std::vector<std::string> mlpCommand(const MlpRun& r) {
  std::vector<std::string> argv = {
      std::string(DDPRUN_BIN_DIR) + "/mnist_mlp", "--train-limit", std::to_string(r.examples),
      "--test-limit", "1000", "--batch-size", std::to_string(r.batch),
      "--epochs", std::to_string(r.epochs), "--seed", std::to_string(r.seed),
      "--lr", "0.05", "--log-interval", "32",
      "--checkpoint-dir", r.dir + "/ckpt", "--checkpoint-interval", "10",
      "--save-weights", r.dir + "/final.pt"};
  if (r.metrics) argv.insert(argv.end(), {"--metrics", r.dir + "/metrics.jsonl"});
  return argv;
}

// A free TCP port on loopback address `addr` (for a job's store or rendezvous endpoint): bound
// once to port 0 and released, so another process may take it first (rare; the job then fails
// naming the port).
inline int freePort(const char* addr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("freePort: socket() failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, addr, &a.sin_addr);
  socklen_t len = sizeof a;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  if (!ok) throw std::runtime_error(std::string("freePort: cannot bind ") + addr);
  return ntohs(a.sin_port);
}

// `ddprun --standalone --nproc-per-node=<nproc> <launcherFlags...> <program...>`.
inline std::vector<std::string> standaloneJob(int nproc, const std::vector<std::string>& program,
                                              const std::vector<std::string>& launcherFlags = {}) {
  std::vector<std::string> argv = {std::string(DDPRUN_BIN_DIR) + "/ddprun", "--standalone",
                                   "--nproc-per-node=" + std::to_string(nproc)};
  argv.insert(argv.end(), launcherFlags.begin(), launcherFlags.end());
  argv.insert(argv.end(), program.begin(), program.end());
  return argv;
}

class Job {
 public:
  // Starts argv[0] (a path) with the process environment plus `env`.
  Job(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
      std::string logPath)
      : process_({.argv = argv, .env = env, .stdoutPath = std::move(logPath),
                  .ownProcessGroup = true}) {}

  pid_t pid() const { return process_.pid(); }
  void signal(int sig) { process_.signal(sig); }
  // Whether the process has exited (it is reaped then; wait() returns its code at once).
  bool exited() { return process_.poll().has_value(); }

  // The exit code (128 + signal for a signal death). Throws after `timeout`, having killed the
  // whole process group.
  int wait(std::chrono::seconds timeout) { return process_.wait(timeout); }

  std::string output() const { return process_.output(); }

 private:
  ddprun::testing::Process process_;
};

// The step of the newest checkpoint file in `dir` (-1 when none). Files appear atomically
// (written under a temporary name, then renamed), so a listed file is complete.
inline int64_t newestCheckpoint(const std::string& dir) {
  int64_t newest = -1;
  std::error_code ec;
  const std::regex name(R"(ckpt-(\d+)\.ddpck)");
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (std::regex_match(file, m, name)) newest = std::max<int64_t>(newest, std::stoll(m[1]));
  }
  return newest;
}

// Waits until the job has checkpointed step `step` or later (at whatever moment of the training
// that is noticed); false when the job ended first or `timeout` passed.
inline bool waitForCheckpoint(Job& job, const std::string& dir, int64_t step,
                              std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (newestCheckpoint(dir) < step) {
    if (std::chrono::steady_clock::now() > deadline || job.exited()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// Waits until the job's output holds `text`; false when the job ended first or `timeout` passed.
inline bool waitForOutput(Job& job, const std::string& text,
                          std::chrono::steady_clock::duration timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (job.output().find(text) == std::string::npos) {
    if (std::chrono::steady_clock::now() > deadline || job.exited()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// `ok`, passed on. When it is false, what each of `jobs` printed so far, under its name, goes
// into the message of the assertion being evaluated (Catch2's UNSCOPED_INFO), so that a failed
// wait says what the jobs did, long before the INFO of their whole output at their end:
//   REQUIRE(showingOutput(waitForOutput(job, "ready", kJobTimeout), job));
// (The jobs' output is read after `ok` was computed: the wait is over by then.)
inline bool showingOutput(bool ok, std::initializer_list<std::pair<std::string, const Job*>> jobs) {
  if (!ok) {
    for (const auto& [name, job] : jobs) {
      if (job) UNSCOPED_INFO(name << " printed so far:\n" << job->output());
    }
  }
  return ok;
}
inline bool showingOutput(bool ok, const Job& job) {
  return showingOutput(ok, {{"the job", &job}});
}

// Hot spare `id` of `agent` the moment it appears, forked from the spare template (its line in
// the agent's output) or exec'd (by /proc), polled every millisecond so that a test can signal
// it long before it loads; -1 when the agent exited first or `timeout` passed.
inline pid_t waitForStartingSpare(Job& agent, int id, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline && !agent.exited()) {
    if (const pid_t p = forkedSparePid(agent.output(), id); p > 0) return p;
    if (const pid_t p = sparePid(agent.pid(), id, "mnist_mlp"); p > 0) return p;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return -1;
}

// The pids of ranks 0..n-1 of `program` under `launcher`, as the environment of their start
// says (RANK; -1 for a rank not found).
inline std::vector<pid_t> workerPids(pid_t launcher, int n, const std::string& program) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) pids.push_back(workerPid(launcher, r, program));
  return pids;
}

// Every pid a process of `program` started as rank r (RANK=r in its environment) had, for each
// r of `ranks`, polled every 50 ms from now until the job exits (bounded by `timeout`). A
// survivor that kept its process to the end gives one pid; a restart of the group, two or more.
inline std::map<int, std::set<pid_t>> rankPidsUntilExit(Job& job, const std::vector<int>& ranks,
                                                        const std::string& program,
                                                        std::chrono::seconds timeout) {
  std::map<int, std::set<pid_t>> seen;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!job.exited() && std::chrono::steady_clock::now() < deadline) {
    for (int r : ranks) {
      const pid_t p = workerPid(job.pid(), r, program);
      if (p > 0) seen[r].insert(p);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return seen;
}

// The first line of `text` that holds `what` (empty: none).
inline std::string lineWith(const std::string& text, const std::string& what) {
  const size_t at = text.find(what);
  if (at == std::string::npos) return {};
  const size_t begin = text.rfind('\n', at);
  const size_t end = text.find('\n', at);
  return text.substr(begin == std::string::npos ? 0 : begin + 1,
                     end == std::string::npos ? std::string::npos : end - begin - 1);
}

}  // namespace ddprun::trainers::testing
