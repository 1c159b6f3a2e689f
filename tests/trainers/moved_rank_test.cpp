// End to end: a rank moved to another node's spare after its node was lost (docs/recovery.md,
// "A moved rank that dies later"), on the three-node fixture (three_nodes.h): under replace with
// --spares=1 node rank 1's rank runs on node rank 0's spare, in the slot after that node's own.
// When that process dies -- later, or before it healed -- node rank 0's next exec'd spare takes
// the rank in process, or the group restarts from the newest checkpoint (one restart, one line
// naming why): a new process is never started for a slot the node's launch does not describe.
#include "tests/support/catch_torch.h"

#include <cerrno>
#include <iostream>
#include <regex>

#include "fashion_mnist.h"
#include "job_runner.h"
#include "sample_log_check.h"
#include "three_nodes.h"
#include "trained_weights.h"
#include "tests/support/skip.h"

using namespace ddprun::trainers;
using namespace ddprun::trainers::testing;
using namespace ddprun::trainers::testing::three_nodes;
using Catch::Matchers::Contains;

namespace {

// Once node rank 0's spare 0 is ready and a checkpoint exists, node rank 1 is lost; returns
// spare 0's pid: node rank 0's agent gives it rank 1 (the moved rank) in generation 1.
pid_t loseNodeRank1ToSpare0(ThreeNodes& job, const TempDir& dir) {
  REQUIRE(job.showingOutput(
      waitForOutput(*job.at[0], "ready: loaded, waiting for a rank", kJobTimeout)));
  const pid_t moved = sparePid(job.at[0]->pid(), 0, "mnist_mlp");
  REQUIRE(moved > 0);
  REQUIRE(job.showingOutput(waitForCheckpoint(*job.at[0], dir / "ckpt", 20, kJobTimeout)));
  job.loseNodeRank1();
  return moved;
}

// Gone from /proc (reaped by its guard: its agent has its exit report), bounded.
bool waitUntilReaped(pid_t pid) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (::kill(pid, 0) == 0 || errno != ESRCH) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace

TEST_CASE("three nodes, replace, --spares=1: node rank 1 lost, its rank moved to node rank 0's "
          "spare, then the moved rank SIGKILLed: node rank 0's next spare takes it in process, "
          "weights bit-identical", "[recovery][nodes][spares][slow]") {
  if (!haveData()) return skipWithoutData();
  const auto& reference = referenceRun();
  TempDir dir;
  ThreeNodes job(dir, {"--max-restarts=2", "--recovery=in-process", "--spares=1"});
  REQUIRE(job.showingOutput(job.findRanks()));
  const pid_t r0 = job.worker[0], r2 = job.worker[2];
  const pid_t moved = loseNodeRank1ToSpare0(job, dir);
  REQUIRE(job.showingOutput(waitForOutput(*job.at[0], "rank 1 joined generation 1", kJobTimeout)));
  // Node rank 0 starts its next spare (3) as spare 0 takes the moved rank; once it is ready,
  // the moved rank (spare 0's process, local rank 1 of node rank 0) is SIGKILLed.
  const pid_t next = waitForNumber(*job.at[0], R"(spare 3 \(pid (\d+)\) ready: loaded)");
  REQUIRE(job.showingOutput(next > 0));
  REQUIRE(::kill(moved, SIGKILL) == 0);
  REQUIRE(job.showingOutput(waitForOutput(*job.at[0], "rank 1 joined generation 2", kJobTimeout)));
  for (pid_t p : {r0, r2, next}) CHECK(::kill(p, 0) == 0);
  const auto [out0, out2] = job.waitForEnd();
  INFO("node rank 0:\n" << out0 << "\nnode rank 2:\n" << out2);
  CHECK_THAT(out0, Contains("generation 1: spare 0 (pid " + std::to_string(moved) +
                            ") of this node takes rank 1 (local rank 1) of a lost node"));
  CHECK(std::regex_search(out0, std::regex(
      "rank 1 \\(local rank 1, pid " + std::to_string(moved) + R"(\) failed: signal 9 )"
      R"(\(SIGKILL\); recovering in process \(generation 2\): the other workers of every node )"
      R"(keep running, spare 3 \(pid )" + std::to_string(next) + R"(\) takes rank 1 \(restart 2 )"
      R"(of 2 spent\))")));
  CHECK_THAT(out2, Contains("generation 2 of the worker group (another node recovered in "
                            "process; this node's workers keep running)"));
  CHECK_THAT(out0 + out2, !Contains("restarting the worker"));
  CHECK_THAT(out0 + out2, !Contains("resumed from checkpoint"));
  CHECK_THAT(out0, Contains("done: "));
  CHECK(bitIdentical(loadWeights(dir / "final.pt"), loadWeights(reference / "final.pt")));
}

TEST_CASE("three nodes, replace, --spares=1: node rank 1 lost, the spare given its rank SIGKILLed "
          "before it healed: its node's next spare takes it in process, or the group restarts, never a "
          "process for a slot the node does not have",
          "[recovery][nodes][spares][slow]") {
  if (!haveData()) return skipWithoutData();
  const auto& reference = referenceRun();
  TempDir dir;
  ThreeNodes job(dir, {"--max-restarts=2", "--recovery=in-process", "--spares=1"});
  REQUIRE(job.showingOutput(job.findRanks()));
  const pid_t moved = loseNodeRank1ToSpare0(job, dir);
  // The spare dies the moment its agent has given it the rank: before (or while) it heals from
  // a survivor's memory, with the survivors waiting for it in generation 1.
  REQUIRE(job.showingOutput(waitForOutput(
      *job.at[0],
      "generation 1: spare 0 (pid " + std::to_string(moved) + ") of this node takes rank 1",
      kJobTimeout)));
  REQUIRE(::kill(moved, SIGKILL) == 0);
  const auto [out0, out2] = job.waitForEnd();
  INFO("node rank 0:\n" << out0 << "\nnode rank 2:\n" << out2);
  CHECK_THAT(out0, Contains("rank 1 (local rank 1, pid " + std::to_string(moved) + ") failed: "
                            "signal 9 (SIGKILL)"));
  CHECK_THAT(out0, !Contains("joined generation 1 and healed"));
  CHECK_THAT(out0 + out2, Contains("done: "));
  // Node rank 0's next spare (3, forked from the template as spare 0 took the rank) takes the
  // rank in process (generation 2) if it is exec'd by then; else the group restarts (a new
  // process cannot take a slot after the node's own: before, one was started, and exited
  // with "LOCAL_RANK=1 is not below LOCAL_WORLD_SIZE=1", ending the job).
  CHECK_THAT(out0, !Contains("is not below LOCAL_WORLD_SIZE"));
  const bool inProcess = out0.find("recovering in process (generation 2)") != std::string::npos;
  std::cout << "after the spare's death: " << (inProcess ? "in process" : "restart") << std::endl;
  if (inProcess) {
    CHECK_THAT(out0, Contains("rank 1 joined generation 2"));
    CHECK(bitIdentical(loadWeights(dir / "final.pt"), loadWeights(reference / "final.pt")));
  } else {
    // No exec'd spare when the death was checked (the usual case), or it ended since.
    CHECK_THAT(out0, Contains("rank 1 had moved to this node from a lost node, and "));
    CHECK_THAT(out0 + out2, Contains("resumed from checkpoint"));
  }
}

TEST_CASE("three nodes, replace, --spares=1: the moved rank SIGKILLed with no spare of its new "
          "node waiting, the group restarts once, spending one restart, not two",
          "[recovery][nodes][spares][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  ThreeNodes job(dir, {"--max-restarts=2", "--recovery=in-process", "--spares=1"});
  REQUIRE(job.showingOutput(job.findRanks()));
  const pid_t moved = loseNodeRank1ToSpare0(job, dir);
  REQUIRE(job.showingOutput(waitForOutput(*job.at[0], "rank 1 joined generation 1", kJobTimeout)));
  // Node rank 0's next spares (3, 6, 9) SIGKILLed as they start: three dead before they were
  // ready end the spares of its group, so none waits when the moved rank dies.
  for (int id : {3, 6, 9}) {
    const pid_t p = waitForStartingSpare(*job.at[0], id, kJobTimeout);
    INFO("spare " << id);
    REQUIRE(job.showingOutput(p > 0));
    REQUIRE(::kill(p, SIGKILL) == 0);
  }
  REQUIRE(job.showingOutput(
      waitForOutput(*job.at[0], "the third in a row: no more spares for this group", kJobTimeout)));
  REQUIRE(::kill(moved, SIGKILL) == 0);
  // Both survivors exit 0 (waitForEnd requires it). Before the check came ahead of the budget,
  // the recovery spent restart 2 of 2 and then restarted the group, a failure reported afresh
  // with no restart left: the job failed.
  const auto [out0, out2] = job.waitForEnd();
  INFO("node rank 0:\n" << out0 << "\nnode rank 2:\n" << out2);
  CHECK_THAT(out0, Contains("--recovery=in-process: rank 1 had moved to this node from a lost "
                            "node, and no spare of this node is waiting to take it"));
  CHECK_THAT(out0, !Contains("recovering in process (generation 2)"));
  CHECK_THAT(out0, !Contains("in-process recovery of rank 1 failed"));
  CHECK_THAT(out0 + out2, Contains("resumed from checkpoint"));
  CHECK_THAT(out0 + out2, Contains("done: "));
}

TEST_CASE("three nodes, replace, --spares=1: the moved rank's waiting spare dies between the "
          "check and the budget's answer, the group restarts with one line naming it, "
          "spending no second restart", "[recovery][nodes][spares][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  // --max-restarts=2: the node's loss spends one, the moved rank's recovery the second, and the
  // restart that recovery turns into spends none (before, it spent a third: the job failed).
  ThreeNodes job(dir, {"--max-restarts=2", "--recovery=in-process", "--spares=1"});
  REQUIRE(job.showingOutput(job.findRanks()));
  const pid_t moved = loseNodeRank1ToSpare0(job, dir);
  REQUIRE(job.showingOutput(waitForOutput(*job.at[0], "rank 1 joined generation 1", kJobTimeout)));
  // Node rank 0's next spares 3 and 6 SIGKILLed as they start (two dead before they were ready);
  // spare 9 is SIGSTOPped as it starts: it waits (exec'd) but is never ready, so its death will
  // be the third in a row and no other is started after it (a ready spare's death would be
  // replaced, and the new spare could take the rank).
  pid_t last = -1;
  for (int id : {3, 6, 9}) {
    const pid_t p = waitForStartingSpare(*job.at[0], id, kJobTimeout);
    INFO("spare " << id);
    REQUIRE(job.showingOutput(p > 0));
    REQUIRE(::kill(p, id != 9 ? SIGKILL : SIGSTOP) == 0);
    last = p;
  }
  // The window, held open: the rendezvous store stopped, so the budget's answer cannot come.
  // The moved rank dies (the check finds spare 9 waiting and asks for the budget), then spare 9
  // dies; the store goes on well within the agents' keep-alive bound (3 x 0.3 s).
  REQUIRE(::kill(job.store->pid(), SIGSTOP) == 0);
  REQUIRE(::kill(moved, SIGKILL) == 0);
  const bool reaped = waitUntilReaped(moved);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the check: one link round trip
  REQUIRE(::kill(last, SIGKILL) == 0);
  const bool spareReaped = waitUntilReaped(last);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  REQUIRE(::kill(job.store->pid(), SIGCONT) == 0);
  REQUIRE(job.showingOutput(reaped));
  REQUIRE(job.showingOutput(spareReaped));
  const auto [out0, out2] = job.waitForEnd();
  INFO("node rank 0:\n" << out0 << "\nnode rank 2:\n" << out2);
  REQUIRE_THAT(out0, !Contains("spare 9 (pid " + std::to_string(last) + ") ready"));
  CHECK_THAT(out0, Contains("spare 9 (pid " + std::to_string(last) + ") died before it was "
                            "ready (signal 9 (SIGKILL)), the third in a row"));
  CHECK_THAT(out0, Contains("in-process recovery of rank 1 failed: rank 1 had moved to this "
                            "node from a lost node, and the spare of this node that was waiting "
                            "to take it died"));
  CHECK_THAT(out0, !Contains("--recovery=in-process: rank 1 had moved"));  // not the check's
  CHECK_THAT(out0, !Contains("recovering in process (generation 2)"));
  CHECK_THAT(out0, Contains("restart 2 of 2 spent by this node"));
  CHECK_THAT(out0 + out2, !Contains("no restart is left"));
  CHECK_THAT(out0 + out2, Contains("resumed from checkpoint"));
  CHECK_THAT(out0 + out2, Contains("done: "));
}
