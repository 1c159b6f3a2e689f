// End to end: hot spares forked from the spare template (ddprun --spares;
// docs/recovery.md#spare-template), the real mnist_mlp under the real ddprun.
//
// A spare forked from the template takes a SIGKILLed rank and the run ends bit-identical to an
// uninterrupted one; the template SIGKILLed, the next spare is exec'd as before and the job still
// finishes; ddprun SIGKILLed with a forked spare waiting leaves no process of the job alive, nor
// with the template forked from rank 0 (shrink without spares), which is in no guard's tree.
#include "tests/support/catch_torch.h"
#include <sched.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "fashion_mnist.h"
#include "rendezvous/tcp_store.h"
#include "job_runner.h"
#include "trained_weights.h"
#include "test_files.h"
#include "tests/support/skip.h"

using namespace ddprun::trainers;
using namespace ddprun::trainers::testing;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

constexpr auto kJobTimeout = std::chrono::seconds(120);
// 1024 steps, ~4.5 s here: the spare template and a spare load at normal priority beside the
// two ranks, and a 512-step job (2.3 s) once ended on a loaded CI machine before they had.
constexpr int kEpochs = 8;

std::vector<std::string> job(const std::string& dir, std::vector<std::string> flags,
                             int epochs = kEpochs) {
  return standaloneJob(2, mlpCommand({.dir = dir, .batch = 16, .epochs = epochs, .metrics = true}),
                       flags);
}

const TempDir& referenceRun() {
  static TempDir dir;
  static const bool done = [] {
    Job j(job(dir.path(), {}), {}, dir / "log");
    const int code = j.wait(kJobTimeout);
    INFO(j.output());
    REQUIRE(code == 0);
    REQUIRE_THAT(j.output(), Contains("done: 1024 steps"));
    return true;
  }();
  (void)done;
  return dir;
}

// The pid in the first "<before><pid><after>" of `text`, or -1.
pid_t pidBetween(const std::string& text, const std::string& before, const std::string& after) {
  for (size_t at = text.find(before); at != std::string::npos; at = text.find(before, at + 1)) {
    const size_t digits = at + before.size();
    size_t end = digits;
    while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
    if (end > digits && text.compare(end, after.size(), after) == 0) {
      return static_cast<pid_t>(std::stol(text.substr(digits, end - digits)));
    }
  }
  return -1;
}

// Waits for "<before><pid><after>" in the job's output; the pid, or -1.
pid_t waitForPid(Job& j, const std::string& before, const std::string& after) {
  const auto deadline = std::chrono::steady_clock::now() + kJobTimeout;
  while (std::chrono::steady_clock::now() < deadline && !j.exited()) {
    if (const pid_t p = pidBetween(j.output(), before, after); p > 0) return p;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return -1;
}

// Not a process any more, or a zombie (state Z or X: it runs nothing).
bool dead(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return true;
  const size_t close = stat.rfind(')');
  return close == std::string::npos || stat.size() <= close + 2 || stat[close + 2] == 'Z' ||
         stat[close + 2] == 'X';
}

// The parent pid of `pid` (field 4 of /proc/<pid>/stat), or -1.
pid_t parentOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return -1;
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(stat.substr(close + 2));
  char state = 0;
  pid_t parent = -1;
  rest >> state >> parent;
  return parent;
}

// The scheduling policy of `pid` once it is `want`, waiting up to 5 s (-1: gone).
int policyOnceIs(pid_t pid, int want) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int policy = ::sched_getscheduler(pid);
  while (policy != want && policy >= 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    policy = ::sched_getscheduler(pid);
  }
  return policy;
}

// The pids of `seen` still running (not dead()) after waiting up to `timeout` for them.
std::vector<pid_t> survivors(const std::set<pid_t>& seen, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<pid_t> alive;
  do {
    alive.clear();
    for (pid_t p : seen) {
      if (!dead(p)) alive.push_back(p);
    }
    if (alive.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (std::chrono::steady_clock::now() < deadline);
  return alive;
}

// Waits for exec'd spare `id` (its environment in /proc says DDPRUN_SPARE=<id>); its pid, or -1.
pid_t waitForExecdSpare(Job& j, int id) {
  const auto deadline = std::chrono::steady_clock::now() + kJobTimeout;
  pid_t pid = -1;
  while (pid <= 0 && std::chrono::steady_clock::now() < deadline && !j.exited()) {
    pid = sparePid(j.pid(), id, "mnist_mlp");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return pid;
}

// Adds every process of the job now (guards, workers, template, spares) to `seen`, waits for
// the job's end and returns its output; the job must succeed.
std::string finishJob(Job& j, std::set<pid_t>& seen) {
  for (pid_t p : descendants(j.pid())) seen.insert(p);
  const int code = j.wait(kJobTimeout);
  const std::string output = j.output();
  INFO(output);
  REQUIRE(code == 0);
  return output;
}

}  // namespace

TEST_CASE("spare template: a spare forked from it takes a SIGKILLed rank and heals, weights "
          "bit-identical, nothing of the job survives", "[elastic][recovery][spares][slow]") {
  if (!haveData()) return skipWithoutData();
  const auto& reference = referenceRun();
  TempDir dir;
  std::string output;
  pid_t templ = -1, forked = -1;
  int guardPolicy = -1, forkedPolicy = -1;
  std::set<pid_t> seen;
  {
    Job j(job(dir.path(), {"--max-restarts=2", "--recovery=in-process", "--spares=1"}), {},
          dir / "log");
    templ = waitForPid(j, "spare template (pid ", ") ready: loaded, forks");
    REQUIRE(showingOutput(templ > 0, j));
    REQUIRE(showingOutput(waitForOutput(j, "spare 0 (pid ", kJobTimeout), j));
    REQUIRE(showingOutput(waitForOutput(j, "ready: loaded, waiting for a rank", kJobTimeout), j));
    const pid_t spare0 = sparePid(j.pid(), 0, "mnist_mlp");  // exec'd: found by its environment
    const pid_t victim = workerPid(j.pid(), 1, "mnist_mlp");
    REQUIRE(spare0 > 0);
    REQUIRE(victim > 0);
    REQUIRE(::kill(victim, SIGKILL) == 0);
    // Spare 0 is rank 1 now; spare 1 is a fork of the template (its /proc environment is the
    // template's, so it is found by its line).
    forked = waitForPid(j, "spare 1 (pid ", ") forked from the spare template (pid " +
                                                std::to_string(templ) + ")");
    REQUIRE(showingOutput(forked > 0, j));
    // Asked at idle priority (nobody waits for it), so its guard forked it under SCHED_IDLE
    // and came back to SCHED_OTHER: a guard at idle priority would report its exit late.
    const pid_t guard = parentOf(forked);
    guardPolicy = guard > 0 ? policyOnceIs(guard, SCHED_OTHER) : -2;
    forkedPolicy = ::sched_getscheduler(forked);
    REQUIRE(showingOutput(
        waitForOutput(j, "spare 1 (pid " + std::to_string(forked) + ") ready: loaded", kJobTimeout),
        j));
    REQUIRE(
        showingOutput(waitForOutput(j, "rank 1 joined generation 1 and healed", kJobTimeout), j));
    // The forked spare takes rank 1 again: kill spare 0, now rank 1.
    REQUIRE(::kill(spare0, SIGKILL) == 0);
    REQUIRE(showingOutput(
        waitForOutput(j, "spare 1 (pid " + std::to_string(forked) + ") takes rank 1", kJobTimeout),
        j));
    output = finishJob(j, seen);
  }
  INFO(output);
  CHECK(seen.count(forked) == 1);
  CHECK(seen.count(templ) == 1);
  if (output.find("start at normal priority, not SCHED_IDLE") == std::string::npos) {
    CHECK(forkedPolicy == SCHED_IDLE);
    CHECK(guardPolicy == SCHED_OTHER);
  }
  CHECK_THAT(output, Contains("spare 1 forked from the spare template (pid " +
                              std::to_string(templ) + ")"));
  // The template ran the trainer's warm-up once, before it said ready; its fork starts warm and
  // does not run it again (the weights above show the warm-up left nothing in the results).
  const std::string templWarm = "spare template (pid " + std::to_string(templ) + ") warmed up in";
  const std::string templReady = "spare template (pid " + std::to_string(templ) + ") ready";
  CHECK_THAT(output, Contains(templWarm));
  CHECK(output.find(templWarm) < output.find(templReady));
  CHECK_THAT(output, !Contains("spare 1 (pid " + std::to_string(forked) + ") warmed up"));
  CHECK_THAT(output, Contains("rank 1 joined generation 2 and healed from rank 0's memory"));
  CHECK_THAT(output, !Contains("attempt 1"));
  CHECK_THAT(output, !Contains("resumed from checkpoint"));
  CHECK_THAT(output, Contains("done: 1024 steps"));
  CHECK(bitIdentical(loadWeights(dir / "final.pt"), loadWeights(reference / "final.pt")));
  CHECK(survivors(seen, std::chrono::seconds(5)).empty());
}

TEST_CASE("spare template: SIGKILLed, the next spare is exec'd as before and the job finishes, "
          "weights bit-identical", "[elastic][recovery][spares][slow]") {
  if (!haveData()) return skipWithoutData();
  const auto& reference = referenceRun();
  TempDir dir;
  std::string output;
  std::set<pid_t> seen;
  pid_t next = -1;
  {
    Job j(job(dir.path(), {"--max-restarts=1", "--recovery=in-process", "--spares=1"}), {},
          dir / "log");
    const pid_t templ = waitForPid(j, "spare template (pid ", ") ready: loaded, forks");
    REQUIRE(showingOutput(templ > 0, j));
    REQUIRE(showingOutput(waitForOutput(j, "ready: loaded, waiting for a rank", kJobTimeout), j));
    REQUIRE(::kill(templ, SIGKILL) == 0);
    REQUIRE(showingOutput(
        waitForOutput(j, "the spare template (pid " + std::to_string(templ) + ") exited",
                      kJobTimeout),
        j));
    const pid_t victim = workerPid(j.pid(), 1, "mnist_mlp");
    REQUIRE(victim > 0);
    REQUIRE(::kill(victim, SIGKILL) == 0);
    next = waitForExecdSpare(j, 1);
    output = finishJob(j, seen);
  }
  INFO(output);
  CHECK(next > 0);
  CHECK_THAT(output, Contains("exited (signal 9 (SIGKILL)): the spares started from now on are "
                              "started as processes"));
  CHECK_THAT(output, !Contains("spare 1 forked from the spare template"));
  CHECK_THAT(output, Contains("rank 1 joined generation 1 and healed from rank 0's memory"));
  CHECK_THAT(output, Contains("done: 1024 steps"));
  CHECK(bitIdentical(loadWeights(dir / "final.pt"), loadWeights(reference / "final.pt")));
  CHECK(survivors(seen, std::chrono::seconds(5)).empty());
}

// The agent asks the template for the next spare after a recovery without waiting on its loop
// (which serves the workers' store and sees deaths) for the answer: the template forks it at
// idle priority, which takes what CPU time the ranks leave. A stopped template never answers:
// the store still answers every request at once, and after the answer's bound (1 s for a
// stopped template; a running one is waited for up to 30 s) the spare is exec'd instead.
TEST_CASE("spare template: SIGSTOPped, the agent's store keeps answering while it waits for "
          "the template, the next spare is exec'd after 1 s and the job finishes",
          "[elastic][recovery][spares][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  std::string output;
  std::set<pid_t> seen;
  pid_t next = -1;
  int64_t slowestMs = -1, pings = 0;
  std::string pingError;
  {
    // 2048 steps (~9 s here): the job must outlast the spare's load, the 1 s bound and an
    // exec'd spare's start on a loaded machine (the weights are the other tests' to check).
    Job j(job(dir.path(), {"--max-restarts=1", "--recovery=in-process", "--spares=1"}, 16), {},
          dir / "log");
    const pid_t templ = waitForPid(j, "spare template (pid ", ") ready: loaded, forks");
    REQUIRE(showingOutput(templ > 0, j));
    REQUIRE(showingOutput(waitForOutput(j, "ready: loaded, waiting for a rank", kJobTimeout), j));
    const pid_t rank0 = workerPid(j.pid(), 0, "mnist_mlp");
    const pid_t victim = workerPid(j.pid(), 1, "mnist_mlp");
    REQUIRE(rank0 > 0);
    REQUIRE(victim > 0);
    const auto client = workerStore(rank0);
    ddprun::rendezvous::TcpStore& store = *client;
    REQUIRE(::kill(templ, SIGSTOP) == 0);
    REQUIRE(::kill(victim, SIGKILL) == 0);
    // From the death until the template's answer is given up: a store request every 10 ms.
    const std::string givenUp = "spare template (pid " + std::to_string(templ) +
                                "): the spare template is stopped and did not answer in 1000 ms; spare "
                                "1 and "
                                "the later ones are started as processes";
    const auto deadline = std::chrono::steady_clock::now() + kJobTimeout;
    while (std::chrono::steady_clock::now() < deadline && !j.exited() &&
           j.output().find(givenUp) == std::string::npos) {
      const auto start = std::chrono::steady_clock::now();
      try {
        store.check({"ping"});
      } catch (const std::exception& e) {
        pingError = e.what();
        break;
      }
      slowestMs = std::max<int64_t>(
          slowestMs, std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::steady_clock::now() - start).count());
      ++pings;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    INFO("the store request failed: " << pingError);
    REQUIRE(showingOutput(pingError.empty(), j));
    REQUIRE(showingOutput(j.output().find(givenUp) != std::string::npos, j));
    next = waitForExecdSpare(j, 1);
    // Continued, it reads the request nobody waits for; the guard it forks finds its control
    // socket closed and kills its spare.
    REQUIRE(::kill(templ, SIGCONT) == 0);
    output = finishJob(j, seen);
  }
  INFO(output);
  INFO("store requests: " << pings << ", the slowest " << slowestMs << " ms");
  CHECK(next > 0);
  CHECK_THAT(output, Contains("starting spare 1 in the background (SCHED_IDLE)"));
  CHECK_THAT(output, !Contains("spare 1 forked from the spare template"));
  // Waiting on its loop, the agent had held every request ~1 s.
  CHECK(pings >= 20);
  CHECK(slowestMs < 500);
  CHECK_THAT(output, Contains("rank 1 joined generation 1 and healed from rank 0's memory"));
  CHECK_THAT(output, !Contains("attempt 1"));
  CHECK_THAT(output, Contains("done: 2048 steps"));
  CHECK(survivors(seen, std::chrono::seconds(5)).empty());
}

TEST_CASE("spare template: ddprun SIGKILLed with a forked spare waiting, no process of the job "
          "survives", "[elastic][recovery][spares][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  Job j(job(dir.path(), {"--recovery=in-process", "--spares=1"}), {}, dir / "log");
  const pid_t templ = waitForPid(j, "spare template (pid ", ") ready: loaded, forks");
  REQUIRE(showingOutput(templ > 0, j));
  REQUIRE(showingOutput(waitForOutput(j, "ready: loaded, waiting for a rank", kJobTimeout), j));
  const pid_t spare0 = sparePid(j.pid(), 0, "mnist_mlp");
  REQUIRE(spare0 > 0);
  REQUIRE(::kill(spare0, SIGKILL) == 0);  // a waiting spare's death: the next one is a fork
  const pid_t forked = waitForPid(j, "spare 1 (pid ", ") forked from the spare template");
  REQUIRE(showingOutput(forked > 0, j));
  REQUIRE(showingOutput(
      waitForOutput(j, "spare 1 (pid " + std::to_string(forked) + ") ready: loaded", kJobTimeout),
      j));
  std::set<pid_t> seen;
  for (pid_t p : descendants(j.pid())) seen.insert(p);
  INFO(j.output());
  REQUIRE(seen.count(forked) == 1);
  REQUIRE(seen.count(templ) == 1);
  ::kill(j.pid(), SIGKILL);
  j.wait(kJobTimeout);
  const auto left = survivors(seen, std::chrono::seconds(10));
  for (pid_t p : left) UNSCOPED_INFO("still alive: pid " << p);
  CHECK(left.empty());
}

TEST_CASE("spare template forked from rank 0 (shrink without spares): ddprun SIGKILLed once it "
          "is ready, no process of the job survives, the template included (it is in no "
          "guard's tree)", "[elastic][recovery][shrink][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  Job j(job(dir.path(), {"--recovery=in-process", "--recovery-policy=shrink"}), {}, dir / "log");
  const pid_t templ = waitForPid(j, "spare template (pid ", ") ready: loaded, forks");
  REQUIRE(showingOutput(templ > 0, j));
  REQUIRE_THAT(j.output(), Contains("spare template (pid " + std::to_string(templ) +
                                    ") forked from the rank with pid "));
  std::set<pid_t> seen;
  for (pid_t p : descendants(j.pid())) seen.insert(p);
  INFO(j.output());
  REQUIRE(seen.count(templ) == 1);
  CHECK(procParent(templ) == j.pid());
  ::kill(j.pid(), SIGKILL);
  j.wait(kJobTimeout);
  const auto left = survivors(seen, std::chrono::seconds(10));
  for (pid_t p : left) UNSCOPED_INFO("still alive: pid " << p);
  CHECK(left.empty());
}
