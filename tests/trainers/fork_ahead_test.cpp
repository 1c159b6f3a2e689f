// End to end: the spare forked ahead of its request (docs/recovery.md#spare-template;
// worker_runtime/spare/spare_guard.h) -- the real mnist_mlp under the real ddprun, shrink without
// spares, real SIGKILLs:
//   - the template forks a guard and a spare before it says ready; they wait in the template's
//     process group; rank 1 SIGKILLed, that very pair becomes the replacement (no fork on the
//     grow back's path), moves to a group of its own, and the template forks the next pair a
//     second later, which ddprun kills and reaps with the template at the end;
//   - the waiting spare SIGKILLed first: its guard leaves, and the template forks the
//     replacement on request, one line saying so; every sample still once;
//   - the replacement asked for at the shrink itself: with a survivor SIGSTOPped (it cannot
//     re-form) it is forked all the same, and the group grows back once the survivor goes on.
#include "tests/support/catch_torch.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "fashion_mnist.h"
#include "job_runner.h"
#include "shrink_job.h"
#include "test_files.h"
#include "launcher/worker_lookup.h"
#include "tests/support/process.h"

using namespace ddprun::trainers;
using namespace ddprun::trainers::testing;
using Catch::Matchers::Contains;

namespace {

void checkSamples(const TempDir& dir) {
  const std::string log = dir / "samples";
  CHECK(worldSequence(log, kGrowEpochs) == std::vector<int>{3, 2, 3});
  for (int e = 0; e < kGrowEpochs; ++e) checkExactlyOnce(log, e, epochSamples(log, e).lastWorld);
}

}  // namespace

TEST_CASE("shrink without spares: the template forks a spare ahead before it says ready, that "
          "spare takes the dead rank back without a fork on the grow back's path, the next one "
          "is forked a second later, and ddprun kills and reaps it with the template",
          "[recovery][shrink][grow][template][ahead][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  Job job(rankTemplateJob(dir), sampleLogEnv(dir), dir / "log");
  const auto pids = ranksOf(job, dir, 3);
  const pid_t templ = readyRankTemplate(job);
  const auto [guard, spare] = aheadPair(job, templ);
  REQUIRE(::kill(pids[1], SIGKILL) == 0);
  REQUIRE(showingOutput(waitForOutput(job, "the group grew", kJobTimeout), job));
  // The pair that waited is the replacement, now in a process group of its own (the guard's).
  CHECK(::getpgid(guard) == guard);
  CHECK(::getpgid(spare) == guard);
  REQUIRE(showingOutput(waitForOutput(job, "the next spare forked ahead of its request, guard pid",
                                      kJobTimeout), job));
  const pid_t next = capturedPid(job.output(), R"(the next spare forked ahead of its request, )"
                                               R"(guard pid (\d+))");
  REQUIRE(next > 0);
  CHECK(next != guard);
  CHECK(procParent(next) == job.pid());
  CHECK(::getpgid(next) == ::getpgid(templ));
  const std::string out = finishOk(job);
  const std::string t = std::to_string(templ);
  CHECK_THAT(out, Contains("spare 0 forked from the spare template (pid " + t + "), guard pid " +
                           std::to_string(guard)));
  CHECK_THAT(out, Contains("spare 0 (pid " + std::to_string(spare) + ") forked from the spare "
                           "template (pid " + t + ") ahead of its request"));
  CHECK(forkedSparePid(out, 0) == spare);
  CHECK_THAT(out, Contains("grow back (generation 2): spare 0 (pid " + std::to_string(spare) +
                           ") is ready and takes rank 1"));
  CHECK_THAT(out, Contains("pages the template's warm-up wrote in"));
  CHECK_THAT(out, Contains(", before it was asked"));
  CHECK_THAT(out, !Contains("is gone; forking one"));
  // Nothing of the template's group outlives the job: the template, the pair that waited.
  CHECK_FALSE(ddprun::testing::processRunning(templ));
  CHECK_FALSE(ddprun::testing::processRunning(next));
  checkSamples(dir);
}

TEST_CASE("shrink without spares: the spare forked ahead SIGKILLed while it waits, its guard "
          "leaves, and the replacement is forked on request, one line saying so, every sample "
          "once", "[recovery][shrink][grow][template][ahead][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  Job job(rankTemplateJob(dir), sampleLogEnv(dir), dir / "log");
  const auto pids = ranksOf(job, dir, 3);
  const pid_t templ = readyRankTemplate(job);
  const auto [guard, spare] = aheadPair(job, templ);
  REQUIRE(::kill(spare, SIGKILL) == 0);
  // Its guard sees it go and leaves (a zombie of ddprun's until the template's group is reaped).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (ddprun::testing::processRunning(guard) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  REQUIRE_FALSE(ddprun::testing::processRunning(guard));
  REQUIRE(::kill(pids[1], SIGKILL) == 0);
  const std::string out = finishOk(job);
  CHECK_THAT(out, Contains("spare template (pid " + std::to_string(templ) + "): the spare "
                           "forked ahead (guard pid " + std::to_string(guard) + ") is gone; "
                           "forking one"));
  const pid_t replacement = forkedSparePid(out, 0);
  REQUIRE(replacement > 0);
  CHECK(replacement != spare);
  CHECK_THAT(out, !Contains("spare 0 (pid " + std::to_string(replacement) + ") forked from the "
                            "spare template (pid " + std::to_string(templ) + ") ahead"));
  CHECK_THAT(out, Contains("grow back (generation 2): spare 0 (pid " +
                           std::to_string(replacement) + ") is ready and takes rank 1"));
  CHECK_THAT(out, !Contains("restarting the worker group"));
  checkSamples(dir);
}

TEST_CASE("shrink without spares: the replacement is asked for at the shrink, not once the "
          "survivors re-formed: with a survivor SIGSTOPped it is forked all the same, and the "
          "group grows back once the survivor goes on, every sample once",
          "[recovery][shrink][grow][template][ahead][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  // (the stopped survivor is not to be taken for frozen)
  Job job(rankTemplateJob(dir, {"--peer-timeout=120"}), sampleLogEnv(dir), dir / "log");
  const auto pids = ranksOf(job, dir, 3);
  readyRankTemplate(job);
  REQUIRE(::kill(pids[2], SIGSTOP) == 0);
  REQUIRE(::kill(pids[1], SIGKILL) == 0);
  // Rank 2 cannot announce the shrink's generation while it is stopped: the replacement was
  // not waiting for that.
  const bool forked = waitForOutput(job, "spare 0 forked from the spare template (pid ",
                                    std::chrono::seconds(60));
  const char state = ddprun::launcher::lookup::processTable()[pids[2]].state;
  const std::string during = job.output();
  REQUIRE(::kill(pids[2], SIGCONT) == 0);
  INFO(during);
  CHECK(forked);
  CHECK(state == 'T');
  CHECK_THAT(during, !Contains("the group grew"));
  const std::string out = finishOk(job);
  const pid_t replacement = forkedSparePid(out, 0);
  REQUIRE(replacement > 0);
  CHECK_THAT(out, Contains("grow back (generation 2): spare 0 (pid " +
                           std::to_string(replacement) + ") is ready and takes rank 1"));
  CHECK_THAT(out, !Contains("restarting the worker group"));
  checkSamples(dir);
}
