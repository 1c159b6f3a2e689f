#pragma once
// What the shrink tests (shrink_test.cpp, fork_ahead_test.cpp) share: the job they run (the real
// mnist_mlp under the real ddprun, --recovery-policy=shrink, a sample log), the checks of what
// it trained on (every sample of an epoch once, the world size of each step), and the spare
// template's pair forked ahead of the grow back's request.
#include "tests/support/catch_torch.h"

#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "job_runner.h"
#include "sample_log_check.h"
#include "test_files.h"
#include "launcher/worker_lookup.h"
#include "tests/support/process.h"

namespace ddprun::trainers::testing {

inline constexpr auto kJobTimeout = std::chrono::seconds(180);
inline constexpr int64_t kExamples = 4096;
inline constexpr int64_t kBatch = 16;
inline constexpr int kEpochs = 2;
inline constexpr uint64_t kSeed = 11;

// 4096 examples, ranks x 16, `epochs` epochs (job_runner.h's MlpRun).
inline std::vector<std::string> underDdprun(int nproc, const std::string& dir,
                                     std::vector<std::string> launcherFlags,
                                     int epochs = kEpochs) {
  return standaloneJob(nproc,
                       mlpCommand({.dir = dir, .batch = kBatch, .epochs = epochs,
                                   .examples = kExamples, .seed = kSeed}),
                       launcherFlags);
}

inline std::map<std::string, std::string> sampleLogEnv(const TempDir& dir) {
  return {{"DDPRUN_SAMPLE_LOG", dir / "samples"}};
}

// The spare template exec'd once every rank announced (DDPRUN_SPARE_TEMPLATE=exec), not forked
// from rank 0 at its init(): what rank 0 falls back to, and the one a test can hold while it
// loads.
inline std::map<std::string, std::string> execTemplateEnv(const TempDir& dir) {
  auto env = sampleLogEnv(dir);
  env["DDPRUN_SPARE_TEMPLATE"] = "exec";
  return env;
}

inline int finish(Job& job) {
  const int code = job.wait(kJobTimeout);
  INFO(job.output());
  return code;
}

// The job's end (bounded), required to exit 0 (its output in the failure's message); its output.
inline std::string finishOk(Job& job) {
  const int code = finish(job);
  const std::string out = job.output();
  INFO(out);
  REQUIRE(code == 0);
  return out;
}

inline void checkExactlyOnce(const std::string& log, int64_t epoch, int finalWorld) {
  checkEpochExactlyOnce(log, epoch, finalWorld, {.examples = kExamples, .batch = kBatch,
                                                 .seed = kSeed});
}

// The world size of every step of the job, in order, with repeats collapsed: {3, 2, 3} for a
// job that shrank and grew back.
inline std::vector<int> worldSequence(const std::string& log, int epochs) {
  std::vector<int> seq;
  for (int e = 0; e < epochs; ++e) {
    for (int w : epochSamples(log, e).stepWorlds) {
      if (seq.empty() || seq.back() != w) seq.push_back(w);
    }
  }
  return seq;
}

// The pids of ranks 0..n-1 now, each required found.
inline std::vector<pid_t> ranksNow(Job& job, int n) {
  const auto pids = workerPids(job.pid(), n, "mnist_mlp");
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(pids[r] > 0);
  }
  return pids;
}

// The pids of ranks 0..n-1 (each found), once the job has checkpointed step 20: every rank
// holds the training state by then.
inline std::vector<pid_t> ranksOf(Job& job, const TempDir& dir, int n) {
  REQUIRE(showingOutput(waitForCheckpoint(job, dir / "ckpt", 20, kJobTimeout), job));
  return ranksNow(job, n);
}

// The spare template of a shrink job without spares, SIGSTOPped as soon as its process exists.
// It starts once every rank announced the elastic loop, and LibTorch's start-up alone takes
// hundreds of ms, so a death after the first checkpoint finds it loading whatever the
// machine's speed.
inline pid_t heldTemplate(Job& job) {
  pid_t templ = -1;
  const auto deadline = std::chrono::steady_clock::now() + kJobTimeout;
  while ((templ = spareTemplatePid(job.pid(), "mnist_mlp")) <= 0 && !job.exited() &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  REQUIRE(templ > 0);
  REQUIRE(::kill(templ, SIGSTOP) == 0);
  return templ;
}

// Long enough at two ranks (24 epochs of ~0.5 s here) for the replacement, which starts under
// SCHED_IDLE, to load on a busy 2-core machine.
inline constexpr int kGrowEpochs = 24;

// The job of the tests of the spare template forked from rank 0: 3 ranks, shrink without
// spares, long enough for a grow back (kGrowEpochs); `more` launcher flags after those.
inline std::vector<std::string> rankTemplateJob(const TempDir& dir,
                                                const std::vector<std::string>& more = {}) {
  std::vector<std::string> flags = {"--max-restarts=1", "--recovery=in-process",
                                    "--recovery-policy=shrink"};
  flags.insert(flags.end(), more.begin(), more.end());
  return underDdprun(3, dir.path(), flags, kGrowEpochs);
}

// That job's spare template, once it said ready (required found).
inline pid_t readyRankTemplate(Job& job) {
  REQUIRE(showingOutput(waitForOutput(job, ") ready: loaded, forks", kJobTimeout), job));
  const pid_t templ = rankTemplatePid(job.pid(), "mnist_mlp");
  REQUIRE(templ > 0);
  return templ;
}

// The first number the regex `pattern` captures in `text`, or -1.
inline pid_t capturedPid(const std::string& text, const std::string& pattern) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(pattern))) return -1;
  return static_cast<pid_t>(std::stol(m[1]));
}

// The only living child of `parent`, or -1 (none, or more than one).
inline pid_t onlyChild(pid_t parent) {
  const auto table = ddprun::launcher::lookup::processTable();
  pid_t found = -1;
  int n = 0;
  for (const auto& [pid, s] : table) {
    if (s.parent == parent && s.state != 'Z') {
      found = pid;
      ++n;
    }
  }
  return n == 1 ? found : -1;
}

// The guard and spare the template forked ahead, per its ready line, checked where they wait:
// the guard ddprun's child named ddprun-guard, the spare its child running the program, both in
// the template's process group.
inline std::pair<pid_t, pid_t> aheadPair(const Job& job, pid_t templ) {
  namespace lookup = ddprun::launcher::lookup;
  const pid_t guard = capturedPid(job.output(), R"(ready: loaded, forks the spares started from )"
                                                R"(now on \(one forked ahead, guard pid (\d+)\))");
  REQUIRE(guard > 0);
  CHECK(procParent(guard) == job.pid());
  CHECK(::getpgid(guard) == ::getpgid(templ));
  // (forked at the template's idle priority, they name themselves a moment after its line)
  using ddprun::testing::waitUntil;
  constexpr std::chrono::seconds kSetUp(30);
  CHECK(waitUntil([&] { return lookup::procComm(guard) == "ddprun-guard"; }, kSetUp));
  pid_t spare = -1;
  REQUIRE(waitUntil([&] { return (spare = onlyChild(guard)) > 0; }, kSetUp));
  CHECK(waitUntil([&] { return lookup::procComm(spare) == "mnist_mlp"; }, kSetUp));
  CHECK(::getpgid(spare) == ::getpgid(templ));
  return {guard, spare};
}

}  // namespace ddprun::trainers::testing
