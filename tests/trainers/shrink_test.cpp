// End to end: in-process recovery under --recovery-policy=shrink (docs/recovery.md#shrink) --
// the real mnist_mlp under the real ddprun, real SIGKILLs.
//
//   - two of four SIGKILLed at once: one shrink to two ranks (one generation, one restart), the
//     survivors in their own processes, every sample once;
//   - a rank of three SIGKILLed: the survivors go on at two ranks in their own processes, a
//     replacement started in the background joins at a commit (grow back to three), and the
//     samples the job trained on, epoch by epoch, are the dataset's once each;
//   - without spares the replacement is a fork of the spare template, itself a fork of rank 0
//     made at its init(): rank 0's death leaves it alone; a rank 0 with a second thread forks
//     none, and the template is exec'd instead;
//   - the exec'd template (DDPRUN_SPARE_TEMPLATE=exec): a death that finds it loading (held by
//     SIGSTOP) waits for it, and past the wait's 5 s bound the replacement is exec'd instead,
//     one line saying so;
//   - the replacement SIGKILLed before it healed: the job goes on at two ranks, no restart
//     spent, every sample still once;
//   - rank 0 SIGKILLed: the survivor that becomes rank 0 prints, saves the weights, and the
//     samples are still exactly once;
//   - a second death when the budget (--max-restarts) was spent by the first shrink: the job
//     ends with that death as its root cause;
//   - a death that would take the group below the job's minimum (shrink:2): the group restarts.
// What the job trained on comes from the trainer's DDPRUN_SAMPLE_LOG (trainers/sample_log.h):
// every rank's indices of every step, with the generation that took it.
#include "tests/support/catch_torch.h"

#include <sched.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "fashion_mnist.h"
#include "job_runner.h"
#include "sample_log_check.h"
#include "shrink_job.h"
#include "test_files.h"
#include "tests/support/process.h"
#include "tests/support/skip.h"
#include "trainers/mnist_data.h"
#include "worker_runtime/sampler.h"

using namespace ddprun::trainers;
using namespace ddprun::trainers::testing;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

// The checker itself, on written logs: what the grow back's rolled-back step looks like, and two
// logs that must fail (a rank that skipped a step, and the same partial step with no generation
// after it). A CI run failed on the first: the grow came at an epoch's last commit.
TEST_CASE("the sample log check leaves out a step a grow back rolled back at an epoch's end, and "
          "flags a step some rank skipped", "[shrink][sample-log]") {
  TempDir dir;
  const auto write = [&](const std::string& name, const std::vector<std::string>& lines) {
    std::ofstream out(dir / name);
    for (const auto& l : lines) out << l << "\n";
    return std::string(dir / name);
  };
  // World 2 at generation 1; rank 0 is in step 3 when generation 2 (world 3) re-forms at the
  // commit of step 2, and at world 3 the epoch has no step left: step 3 is never taken again.
  const std::vector<std::string> start = {
      "g=1 epoch=0 step=1 rank=0 world=2 idx=0,1",  "g=1 epoch=0 step=1 rank=1 world=2 idx=2,3",
      "g=1 epoch=0 step=2 rank=0 world=2 idx=4,5",  "g=1 epoch=0 step=2 rank=1 world=2 idx=6,7",
      "g=1 epoch=0 step=3 rank=0 world=2 idx=8,9"};
  std::vector<std::string> grown = start;
  for (int r = 0; r < 3; ++r) {
    grown.push_back("g=2 epoch=1 step=3 rank=" + std::to_string(r) + " world=3 idx=" +
                    std::to_string(2 * r) + "," + std::to_string(2 * r + 1));
  }
  const EpochSamples rolled = epochSamples(write("rolled", grown), 0);
  CHECK(rolled.problems.empty());
  CHECK(rolled.rolledBack == 1);
  CHECK(rolled.steps == 2);
  CHECK(rolled.indices == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(epochSamples(dir / "rolled", 1).steps == 1);

  // The same partial step with no generation after it: rank 1 skipped it.
  const EpochSamples alone = epochSamples(write("alone", start), 0);
  CHECK(alone.rolledBack == 0);
  CHECK_THAT(alone.problems, Catch::Matchers::VectorContains(std::string(
                                 "step 3: 1 rank(s) in generation 1, world 2")));

  // A partial step that is not its generation's last: the group went on past it.
  std::vector<std::string> middle = grown;
  middle.erase(middle.begin() + 1);  // rank 1's line of step 1
  const EpochSamples skipped = epochSamples(write("middle", middle), 0);
  CHECK(skipped.rolledBack == 1);
  CHECK_THAT(skipped.problems, Catch::Matchers::VectorContains(std::string(
                                   "step 1: 1 rank(s) in generation 1, world 2")));
}

TEST_CASE("a rank of three SIGKILLed: the other two go on at two ranks in their own processes, "
          "a replacement joins at a commit (grow back to three), every sample of each epoch "
          "exactly once", "[recovery][shrink][grow][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  // The template off: the replacement is exec'd and loads under SCHED_IDLE (the template's
  // fork: the test "shrink without spares: the spare template ...").
  auto env = sampleLogEnv(dir);
  env["DDPRUN_SPARE_TEMPLATE"] = "0";
  Job job(underDdprun(3, dir.path(), {"--max-restarts=1", "--recovery=in-process",
                                      "--recovery-policy=shrink"}, kGrowEpochs),
          env, dir / "log");
  const auto pids = ranksOf(job, dir, 3);
  const pid_t zero = pids[0], one = pids[1], two = pids[2];
  REQUIRE(::kill(one, SIGKILL) == 0);
  // The survivors keep their processes: still running once the group went on without rank 1.
  REQUIRE(showingOutput(waitForOutput(job, "the group shrank", kJobTimeout), job));
  CHECK(::kill(zero, 0) == 0);
  CHECK(::kill(two, 0) == 0);
  REQUIRE(showingOutput(waitForOutput(job, "the group grew", kJobTimeout), job));
  CHECK(::kill(zero, 0) == 0);
  CHECK(::kill(two, 0) == 0);
  const std::string out = finishOk(job);
  INFO(out);
  CHECK_THAT(out, Contains("rank 1 (local rank 1, pid " + std::to_string(one) + ") failed: "
                           "signal 9 (SIGKILL); recovering in process (generation 1): the group "
                           "shrinks from 3 to 2 rank(s), the others keep running (restart 1 of 1 "
                           "spent)"));
  CHECK_THAT(out, Contains("as rank 1 of 2 (was rank 2 of 3; the group shrank)"));
  CHECK_THAT(out, Contains("world size 3 -> 2 (in-process recovery, generation 1)"));
  // The grow: no restart spent, the replacement takes the free slot's rank, the survivor of
  // rank 2 is rank 2 again.
  CHECK_THAT(out, Contains("DDPRUN_SPARE_TEMPLATE=0: no spare template"));
  CHECK_THAT(out, Contains("grow back: a replacement starts in the background"));
  std::smatch m;
  const std::regex grew(R"(grow back \(generation 2\): spare 0 \(pid (\d+)\) is ready and takes )"
                        R"(rank 1 \(local rank 1\); the group grows from 2 to 3 rank\(s\) at the )"
                        R"(workers' next commit \(no restart spent\))");
  REQUIRE(std::regex_search(out, m, grew));
  const std::string newcomer = m[1];
  CHECK_THAT(out, Contains("rank 1 joined generation 2 and healed from rank 0's memory"));
  CHECK_THAT(out, Contains("grow back: rank 1 (pid " + newcomer + ") healed; the group has 3 "
                           "rank(s)"));
  CHECK_THAT(out, Contains("as rank 2 of 3 (was rank 1 of 2; the group grew)"));
  CHECK_THAT(out, Contains("world size 2 -> 3 (in-process recovery, generation 2)"));
  // ddprun's console prefix follows the rank: after the shrink the survivor of rank 2 prints
  // as rank 1 (its own log identity says rank 1 too).
  CHECK(std::regex_search(out, std::regex(R"(\[rank 1\]: \[ddprun W [0-9:.]+ runtime rank 1\] )"
                                          R"(rank 1 recovered in process)")));
  CHECK_THAT(out, !Contains("resumed from checkpoint"));
  CHECK_THAT(out, !Contains("restarting the worker group"));
  CHECK_THAT(out, Contains("done: "));
  CHECK(fs::exists(dir / "final.pt"));
  const std::string log = dir / "samples";
  CHECK(worldSequence(log, kGrowEpochs) == std::vector<int>{3, 2, 3});
  for (int e = 0; e < kGrowEpochs; ++e) {
    const EpochSamples s = epochSamples(log, e);
    checkExactlyOnce(log, e, s.lastWorld);
  }
  CHECK(epochSamples(log, kGrowEpochs - 1).lastWorld == 3);
}

TEST_CASE("shrink without spares: the spare template, held while it loads, is waited for, and "
          "the replacement that grows the group back is a fork of it, every sample exactly once",
          "[recovery][shrink][grow][template][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  Job job(underDdprun(3, dir.path(), {"--max-restarts=1", "--recovery=in-process",
                                      "--recovery-policy=shrink"}, kGrowEpochs),
          execTemplateEnv(dir), dir / "log");
  const pid_t templ = heldTemplate(job);
  // Started under SCHED_IDLE (its guard sets it before the exec), unless ddprun said it cannot.
  const bool startedIdle = ::sched_getscheduler(templ) == SCHED_IDLE;
  const auto pids = ranksOf(job, dir, 3);
  REQUIRE_THAT(job.output(), !Contains(") ready: loaded, forks"));
  REQUIRE(::kill(pids[1], SIGKILL) == 0);
  // Grow back waits for it rather than exec'ing a replacement beside it.
  REQUIRE(showingOutput(
      waitForOutput(job, "grow back: the spare template is still loading", kJobTimeout), job));
  CHECK(::sched_getscheduler(templ) == SCHED_OTHER);  // out of SCHED_IDLE: the group is short
  REQUIRE(::kill(templ, SIGCONT) == 0);
  REQUIRE(showingOutput(waitForOutput(job, "the group grew", kJobTimeout), job));
  const std::string out = finishOk(job);
  INFO(out);
  if (out.find("start at normal priority, not SCHED_IDLE") == std::string::npos) {
    CHECK(startedIdle);
    CHECK_THAT(out, Contains("starting the spare template in the background (SCHED_IDLE)"));
  }
  CHECK_THAT(out, Contains("spare template (pid " + std::to_string(templ) + ") ready: loaded"));
  CHECK_THAT(out, Contains("grow back: a replacement starts (a fork of the spare template)"));
  const pid_t forked = forkedSparePid(out, 0);
  REQUIRE(forked > 0);
  if (startedIdle) {
    // Out of SCHED_IDLE when it loaded: the grow back waited, so the template left the warm-up
    // to its fork rather than make the replacement wait for it as well.
    CHECK_THAT(out, Contains("spare template (pid " + std::to_string(templ) + "): a grow back "
                             "already waits for it"));
    CHECK_THAT(out, !Contains("spare template (pid " + std::to_string(templ) + ") warmed up"));
    CHECK_THAT(out, Contains("spare 0 (pid " + std::to_string(forked) + ") warmed up in"));
  }
  CHECK_THAT(out, Contains("spare 0 (pid " + std::to_string(forked) +
                           ") forked from the spare template (pid " + std::to_string(templ) + ")"));
  CHECK_THAT(out, Contains("grow back (generation 2): spare 0 (pid " + std::to_string(forked) +
                           ") is ready and takes rank 1"));
  CHECK_THAT(out, !Contains("is started as a process"));
  CHECK_THAT(out, !Contains("did not load within"));
  CHECK_THAT(out, !Contains("restarting the worker group"));
  const std::string log = dir / "samples";
  CHECK(worldSequence(log, kGrowEpochs) == std::vector<int>{3, 2, 3});
  for (int e = 0; e < kGrowEpochs; ++e) checkExactlyOnce(log, e, epochSamples(log, e).lastWorld);
}

TEST_CASE("shrink without spares: the spare template held past the wait's bound, the "
          "replacement is exec'd with one line saying so, the group grows back, every sample "
          "exactly once", "[recovery][shrink][grow][template][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  // Longer than the 5 s wait plus an exec'd replacement's load under SCHED_IDLE.
  constexpr int kEpochs = kGrowEpochs + 16;
  Job job(underDdprun(3, dir.path(), {"--max-restarts=1", "--recovery=in-process",
                                      "--recovery-policy=shrink"}, kEpochs),
          execTemplateEnv(dir), dir / "log");
  const pid_t templ = heldTemplate(job);  // never continued: the agent's stop must end it
  const auto pids = ranksOf(job, dir, 3);
  REQUIRE(::kill(pids[1], SIGKILL) == 0);
  REQUIRE(showingOutput(
      waitForOutput(job, "grow back: the spare template is still loading", kJobTimeout), job));
  CHECK(ddprun::testing::processState(templ) == 'T');
  REQUIRE(showingOutput(waitForOutput(job, "the group grew", kJobTimeout), job));
  const std::string out = finishOk(job);
  INFO(out);
  CHECK_THAT(out, Contains("grow back: the spare template did not load within 5 s; the "
                           "replacement is started as a process (the template goes on loading "
                           "in the background)"));
  CHECK_THAT(out, Contains("grow back: a replacement starts in the background"));
  CHECK_THAT(out, !Contains("forked from the spare template"));
  CHECK_THAT(out, Contains("grow back (generation 2): spare 0 (pid "));
  // Stopped with the group, SIGSTOPped as it still was: ddprun leaves nothing of the job.
  CHECK(ddprun::testing::waitUntil([&] { return !ddprun::testing::processRunning(templ); }));
  const std::string log = dir / "samples";
  CHECK(worldSequence(log, kEpochs) == std::vector<int>{3, 2, 3});
  for (int e = 0; e < kEpochs; ++e) checkExactlyOnce(log, e, epochSamples(log, e).lastWorld);
}

TEST_CASE("shrink without spares: the spare template is a fork of rank 0 made at its init(): "
          "rank 0 SIGKILLed, the template outlives it and the replacement that takes rank 0 "
          "back is a fork of it, every sample exactly once, nothing of it outlives ddprun",
          "[recovery][shrink][grow][template][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  Job job(rankTemplateJob(dir), sampleLogEnv(dir), dir / "log");
  const auto pids = ranksOf(job, dir, 3);
  const pid_t templ = readyRankTemplate(job);
  CHECK(templ != pids[0]);
  CHECK(procParent(templ) == job.pid());  // out of rank 0's tree: its guard's sweep misses it
  // and out of its process group, but in its session: the scheduler's autogroups are per
  // session, and a replacement forked in a session of its own took half the CPU from the ranks
  CHECK(::getpgid(templ) != ::getpgid(pids[0]));
  CHECK(::getsid(templ) == ::getsid(pids[0]));
  REQUIRE(::kill(pids[0], SIGKILL) == 0);
  REQUIRE(showingOutput(waitForOutput(job, "the group grew", kJobTimeout), job));
  CHECK(ddprun::testing::processRunning(templ));  // it outlived the rank it was forked from
  {
    // The replacement's guard is ddprun's child, as a launcher guard is: the template made it
    // its own sibling (CLONE_PARENT), in a process group of its own.
    std::smatch m;
    const std::string sofar = job.output();
    const std::regex line(R"(spare 0 forked from the spare template \(pid \d+\), guard pid (\d+))");
    REQUIRE(std::regex_search(sofar, m, line));
    const pid_t guard = static_cast<pid_t>(std::stol(m[1]));
    CHECK(procParent(guard) == job.pid());
    CHECK(::getpgid(guard) == guard);
  }
  const std::string out = finishOk(job);
  INFO(out);
  const std::string t = std::to_string(templ);
  CHECK_THAT(out, Contains("the spare template is forked from rank 0 at its init() (pid " + t));
  CHECK_THAT(out, Contains("spare template (pid " + t + ") forked from the rank with pid " +
                           std::to_string(pids[0]) + " at its init()"));
  CHECK_THAT(out, Contains("spare template (pid " + t + ") ready: loaded"));
  CHECK_THAT(out, !Contains("starting the spare template"));  // no process loads it again
  CHECK_THAT(out, Contains("grow back: a replacement starts (a fork of the spare template)"));
  const pid_t forked = forkedSparePid(out, 0);
  REQUIRE(forked > 0);
  CHECK_THAT(out, Contains("spare 0 (pid " + std::to_string(forked) +
                           ") forked from the spare template (pid " + t + ")"));
  CHECK_THAT(out, Contains("grow back (generation 2): spare 0 (pid " + std::to_string(forked) +
                           ") is ready and takes rank 0"));
  CHECK_THAT(out, !Contains("is started as a process"));
  CHECK_THAT(out, !Contains("restarting the worker group"));
  {
    // The pages the template's warm-up wrote (a minority of its own: the rest it still shares
    // with rank 0's image), and the replacement copied every one before it said ready.
    std::smatch m;
    const std::regex wrote(R"(its warm-up wrote (\d+) of its (\d+) pages)");
    REQUIRE(std::regex_search(out, m, wrote));
    const long pages = std::stol(m[1]), present = std::stol(m[2]);
    CHECK(pages > 0);
    CHECK(pages * 2 <= present);
    CHECK_THAT(out, Contains("spare 0: copied " + std::to_string(pages) + " of the " +
                             std::to_string(pages) + " pages the template's warm-up wrote"));
  }
  // Ended with the group (killed and reaped by ddprun, its parent).
  CHECK_FALSE(ddprun::testing::processRunning(templ));
  const std::string log = dir / "samples";
  CHECK(worldSequence(log, kGrowEpochs) == std::vector<int>{3, 2, 3});
  for (int e = 0; e < kGrowEpochs; ++e) checkExactlyOnce(log, e, epochSamples(log, e).lastWorld);
}

TEST_CASE("shrink without spares: rank 0 with a second thread at init() forks no template, one "
          "line says why, and the template is exec'd once the ranks announced",
          "[recovery][shrink][grow][template][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  auto env = sampleLogEnv(dir);
  env["OPENBLAS_NUM_THREADS"] = "2";  // OpenBLAS starts its second thread as it loads
  Job job(underDdprun(3, dir.path(), {"--max-restarts=1", "--recovery=in-process",
                                      "--recovery-policy=shrink"}, kGrowEpochs),
          env, dir / "log");
  REQUIRE(showingOutput(waitForOutput(job, ") ready: loaded, forks", kJobTimeout), job));
  CHECK(rankTemplatePid(job.pid(), "mnist_mlp") < 0);
  const pid_t templ = spareTemplatePid(job.pid(), "mnist_mlp");
  CHECK(templ > 0);
  const std::string out = finishOk(job);
  INFO(out);
  CHECK_THAT(out, !Contains("the spare template is forked from rank 0"));
  CHECK_THAT(out, Contains("no spare template forked from this process (pid "));
  CHECK_THAT(out, Contains("): it has 2 threads when it calls init() (a fork copies only the "
                           "calling thread); the launcher starts the template as a process"));
  CHECK_THAT(out, Contains("rank 0 forked no spare template (its log says why): it is started "
                           "as a process"));
  CHECK_THAT(out, Contains("starting the spare template in the background"));
  CHECK_THAT(out, Contains("spare template (pid " + std::to_string(templ) + ") ready: loaded"));
}

TEST_CASE("grow back: the replacement SIGKILLed before it healed, the job goes on at two ranks "
          "(no restart spent, no more grow back) with every sample exactly once",
          "[recovery][shrink][grow][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  // --peer-timeout: the survivors are stopped below for as long as the replacement loads.
  Job job(rankTemplateJob(dir, {"--peer-timeout=120"}), sampleLogEnv(dir), dir / "log");
  const auto pids = ranksOf(job, dir, 3);
  const pid_t zero = pids[0], one = pids[1], two = pids[2];
  // The replacement is the pair the template forked ahead, asked for at the shrink: held
  // (SIGSTOP) until the survivors are, so that it cannot be ready before they re-formed.
  const pid_t held = aheadPair(job, readyRankTemplate(job)).second;
  REQUIRE(::kill(held, SIGSTOP) == 0);
  REQUIRE(::kill(one, SIGKILL) == 0);
  // Both survivors in generation 1 (each prints its line once it told the agent so).
  REQUIRE(showingOutput(
      waitForOutput(job, "as rank 0 of 2 (was rank 0 of 3; the group shrank)", kJobTimeout), job));
  REQUIRE(showingOutput(
      waitForOutput(job, "as rank 1 of 2 (was rank 2 of 3; the group shrank)", kJobTimeout), job));
  // The survivors stop where they are (mid-step): the replacement gets the rank, but cannot
  // reach a commit with them, so it is killed before it healed, whatever the machine's speed.
  REQUIRE(::kill(zero, SIGSTOP) == 0);
  REQUIRE(::kill(two, SIGSTOP) == 0);
  REQUIRE(::kill(held, SIGCONT) == 0);
  const bool published = waitForOutput(job, "grow back (generation 2)", kJobTimeout);
  std::smatch m;
  std::string out = job.output();
  const bool named = std::regex_search(
      out, m, std::regex(R"(grow back \(generation 2\): spare 0 \(pid (\d+)\))"));
  if (named) ::kill(std::stoi(m[1]), SIGKILL);
  ::kill(zero, SIGCONT);
  ::kill(two, SIGCONT);
  REQUIRE(showingOutput(published, job));
  REQUIRE(showingOutput(named, job));
  const std::string newcomer = m[1];
  CHECK(newcomer == std::to_string(held));
  out = finishOk(job);
  INFO(out);
  CHECK_THAT(out, Contains("grow back: the replacement, rank 1 (local rank 1, pid " + newcomer +
                           "), died before it healed: signal 9 (SIGKILL); the group goes on "
                           "without it and grows back no more"));
  CHECK_THAT(out, Contains("recovering in process (generation 3): the group shrinks from 3 to 2 "
                           "rank(s), the others keep running (no restart spent)"));
  CHECK_THAT(out, !Contains("healed from rank"));
  CHECK_THAT(out, !Contains("the group grew"));
  CHECK_THAT(out, !Contains("resumed from checkpoint"));
  CHECK_THAT(out, Contains("done: "));
  CHECK(fs::exists(dir / "final.pt"));
  const std::string log = dir / "samples";
  CHECK(worldSequence(log, kGrowEpochs) == std::vector<int>{3, 2});
  for (int e = 0; e < kGrowEpochs; ++e) checkExactlyOnce(log, e, epochSamples(log, e).lastWorld);
}

TEST_CASE("rank 0 SIGKILLed, the survivor that becomes rank 0 reports and saves, every "
          "sample exactly once", "[recovery][shrink][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  Job job(underDdprun(3, dir.path(), {"--max-restarts=1", "--recovery=in-process",
                                      "--recovery-policy=shrink"}),
          sampleLogEnv(dir), dir / "log");
  const pid_t zero = ranksOf(job, dir, 3)[0];
  REQUIRE(::kill(zero, SIGKILL) == 0);
  const std::string out = finishOk(job);
  INFO(out);
  CHECK_THAT(out, Contains("rank 0 (local rank 0, pid " + std::to_string(zero) + ") failed: "
                           "signal 9 (SIGKILL); recovering in process (generation 1): the group "
                           "shrinks from 3 to 2 rank(s)"));
  CHECK_THAT(out, Contains("as rank 0 of 2 (was rank 1 of 3; the group shrank)"));
  CHECK_THAT(out, Contains("world size 3 -> 2 (in-process recovery, generation 1)"));
  CHECK_THAT(out, !Contains("resumed from checkpoint"));
  CHECK_THAT(out, Contains("done: "));
  CHECK(fs::exists(dir / "final.pt"));  // the new rank 0 saved them
  const std::string log = dir / "samples";
  // At 2 ranks, unless the replacement was ready before the end (then it took rank 0 back).
  for (int e = 0; e < kEpochs; ++e) checkExactlyOnce(log, e, epochSamples(log, e).lastWorld);
}

TEST_CASE("two of four ranks SIGKILLed at once: the other two go on at two ranks in their own "
          "processes (one generation, one restart), every sample of each epoch exactly once",
          "[recovery][shrink][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  Job job(underDdprun(4, dir.path(), {"--max-restarts=1", "--recovery=in-process",
                                      "--recovery-policy=shrink"}),
          sampleLogEnv(dir), dir / "log");
  const auto pids = ranksOf(job, dir, 4);
  REQUIRE(ddprun::testing::killAtOnce({pids[1], pids[2]}, SIGKILL));
  const auto seen = rankPidsUntilExit(job, {0, 3}, "mnist_mlp", kJobTimeout);
  const std::string out = finishOk(job);
  INFO(out);
  CHECK(seen.at(0) == std::set<pid_t>{pids[0]});
  CHECK(seen.at(3) == std::set<pid_t>{pids[3]});
  const std::string line = lineWith(out, "recovering in process (generation 1)");
  CHECK_THAT(line, Contains("rank 1 (local rank 1, pid " + std::to_string(pids[1]) + ") failed"));
  CHECK_THAT(line, Contains("rank 2 (local rank 2, pid " + std::to_string(pids[2]) + ") failed"));
  CHECK_THAT(line, Contains("the group shrinks from 4 to 2 rank(s), the others keep running "
                            "(restart 1 of 1 spent, one for the 2 deaths)"));
  CHECK_THAT(out, Contains("as rank 1 of 2 (was rank 3 of 4; the group shrank)"));
  CHECK_THAT(out, Contains("world size 4 -> 2 (in-process recovery, generation 1)"));
  CHECK_THAT(out, !Contains("stopping the other workers"));
  CHECK_THAT(out, !Contains("resumed from checkpoint"));
  CHECK_THAT(out, Contains("done: "));
  const std::string log = dir / "samples";
  // From 4 ranks to 2 at once (a replacement may grow the group back afterwards).
  const auto worlds = worldSequence(log, kEpochs);
  REQUIRE(worlds.size() >= 2);
  CHECK(worlds[0] == 4);
  CHECK(worlds[1] == 2);
  for (int e = 0; e < kEpochs; ++e) checkExactlyOnce(log, e, epochSamples(log, e).lastWorld);
}

TEST_CASE("the budget spent by a shrink, the next death ends the job with its root cause",
          "[recovery][shrink][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  Job job(underDdprun(3, dir.path(), {"--max-restarts=1", "--recovery=in-process",
                                      "--recovery-policy=shrink"}),
          sampleLogEnv(dir), dir / "log");
  const auto pids = ranksOf(job, dir, 3);
  const pid_t one = pids[1], two = pids[2];
  REQUIRE(::kill(one, SIGKILL) == 0);
  REQUIRE(showingOutput(waitForOutput(job, "the group shrank", kJobTimeout), job));
  // Rank 2 of the start is rank 1 of generation 1, or rank 2 again once the replacement (asked
  // for at the shrink) grew the group back: a grow spends no restart, either way this is fatal.
  REQUIRE(::kill(two, SIGKILL) == 0);
  const int code = finish(job);
  const std::string out = job.output();
  INFO(out);
  CHECK(code == 128 + SIGKILL);
  CHECK_THAT(out, Contains("shrinks from 3 to 2 rank(s), the others keep running (restart 1 of 1 "
                           "spent)"));
  CHECK(std::regex_search(out, std::regex("rank [12] \\(local rank 2, pid " +
                                          std::to_string(two) + "\\) failed: signal 9 "
                                          "\\(SIGKILL\\); stopping the other workers")));
  CHECK_THAT(out, Contains("Root cause (first observed failure)"));
  CHECK_THAT(out, !Contains("shrinks from 2 to 1"));
  CHECK_FALSE(fs::exists(dir / "final.pt"));
}

TEST_CASE("a death that would go below the job's minimum (shrink:2) restarts the group",
          "[recovery][shrink][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  Job job(underDdprun(2, dir.path(), {"--max-restarts=1", "--recovery=in-process",
                                      "--recovery-policy=shrink:2"}),
          {}, dir / "log");
  const pid_t one = ranksOf(job, dir, 2)[1];
  REQUIRE(::kill(one, SIGKILL) == 0);
  const std::string out = finishOk(job);
  INFO(out);
  CHECK_THAT(out, Contains("--recovery-policy=shrink: without rank 1 the group would have 1 "
                           "rank(s), below the job's minimum of 2; restarting the group instead"));
  CHECK_THAT(out, Contains("resumed from checkpoint"));
  CHECK_THAT(out, !Contains("the group shrank"));
  CHECK(fs::exists(dir / "final.pt"));
}

TEST_CASE("shrink with a spare still loading (--spares=1): a rank of three SIGKILLed, the group "
          "goes on at two and the spare, once loaded, grows it back to three, every sample exactly "
          "once", "[recovery][shrink][grow][spare][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  Job job(underDdprun(3, dir.path(), {"--max-restarts=1", "--recovery=in-process",
                                      "--recovery-policy=shrink", "--spares=1"}, kGrowEpochs),
          sampleLogEnv(dir), dir / "log");
  // Spare 0 is held before it has loaded: stopped as soon as its process exists (LibTorch's
  // start-up alone takes a few hundred ms), so that the death finds no loaded spare.
  pid_t spare = -1;
  const auto deadline = std::chrono::steady_clock::now() + kJobTimeout;
  while ((spare = sparePid(job.pid(), 0, "mnist_mlp")) <= 0 && !job.exited() &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  REQUIRE(spare > 0);
  REQUIRE(::kill(spare, SIGSTOP) == 0);
  const auto pids = ranksOf(job, dir, 3);
  REQUIRE_THAT(job.output(), !Contains(") ready: loaded, waiting for a rank"));
  REQUIRE(::kill(pids[1], SIGKILL) == 0);
  REQUIRE(showingOutput(
      waitForOutput(job, "the group shrinks from 3 to 2 rank(s)", kJobTimeout), job));
  REQUIRE(::kill(spare, SIGCONT) == 0);
  REQUIRE(showingOutput(waitForOutput(job, "the group grew", kJobTimeout), job));
  const std::string out = finishOk(job);
  INFO(out);
  CHECK_THAT(out, !Contains("so it takes the rank at once"));
  // The warm spare, not a replacement started after the death, takes the free rank.
  CHECK_THAT(out, Contains("grow back (generation 2): spare 0 (pid " + std::to_string(spare)));
  CHECK_THAT(out, !Contains("grow back: a replacement starts in the background"));
  // The spare used, the next one starts in the background.
  CHECK_THAT(out, Contains("starting spare 1"));
  CHECK_THAT(out, !Contains("restarting the worker group"));
  const std::string log = dir / "samples";
  CHECK(worldSequence(log, kGrowEpochs) == std::vector<int>{3, 2, 3});
  for (int e = 0; e < kGrowEpochs; ++e) checkExactlyOnce(log, e, epochSamples(log, e).lastWorld);
}

TEST_CASE("shrink with a loaded spare (--spares=1): a rank of three SIGKILLed, the spare takes "
          "its rank at once instead of a shrink and a grow back, every sample exactly once",
          "[recovery][shrink][spare][slow]") {
  if (!haveData()) return skipWithoutData();
  constexpr int kEpochs = 8;
  TempDir dir;
  Job job(underDdprun(3, dir.path(), {"--max-restarts=1", "--recovery=in-process",
                                      "--recovery-policy=shrink", "--spares=1"}, kEpochs),
          sampleLogEnv(dir), dir / "log");
  // The spare starts with the job (at normal priority) and loads before the death.
  REQUIRE(showingOutput(waitForOutput(job, "spare 0 (pid", kJobTimeout), job));
  REQUIRE(
      showingOutput(waitForOutput(job, ") ready: loaded, waiting for a rank", kJobTimeout), job));
  const auto pids = ranksNow(job, 3);
  const pid_t zero = pids[0], one = pids[1], two = pids[2];
  REQUIRE(::kill(one, SIGKILL) == 0);
  REQUIRE(showingOutput(waitForOutput(job, "recovered in process", kJobTimeout), job));
  CHECK(::kill(zero, 0) == 0);
  CHECK(::kill(two, 0) == 0);
  const std::string out = finishOk(job);
  INFO(out);
  CHECK_THAT(out, Contains("--recovery-policy=shrink: a loaded spare is waiting for rank 1, so it "
                           "takes the rank at once (the group does not shrink and grow back)"));
  CHECK_THAT(out, Contains(") takes rank 1"));
  CHECK_THAT(out, Contains("rank 1 joined generation 1 and healed from rank 0's memory"));
  CHECK_THAT(out, !Contains("the group shrinks"));
  CHECK_THAT(out, !Contains("grow back ("));
  CHECK_THAT(out, !Contains("the group grew"));
  // The spare used, the next one starts in the background.
  CHECK_THAT(out, Contains("starting spare 1"));
  CHECK_THAT(out, !Contains("restarting the worker group"));
  const std::string log = dir / "samples";
  CHECK(worldSequence(log, kEpochs) == std::vector<int>{3});
  for (int e = 0; e < kEpochs; ++e) checkExactlyOnce(log, e, epochSamples(log, e).lastWorld);
}
