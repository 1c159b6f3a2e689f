// End to end: a rank moved to another node's spare after its node was lost (docs/recovery.md,
// "A moved rank that dies later"), on the three-node fixture (three_nodes.h): under replace with
// --spares=1 node rank 1's rank runs on node rank 0's spare, in the slot after that node's own.
// When that process dies -- later, or before it healed -- node rank 0's next exec'd spare takes
// the rank in process, or the group restarts from the newest checkpoint (one restart, one line
// naming why): a new process is never started for a slot the node's launch does not describe.
#include "tests/support/catch_torch.h"

#include <sched.h>

#include <cerrno>
#include <iostream>
#include <regex>

#include "fashion_mnist.h"
#include "job_runner.h"
#include "rendezvous/recovery_keys.h"
#include "rendezvous/tcp_store.h"
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

// How node rank 0's agent names spare `id` (process `pid`) in its lines.
std::string spareName(int id, pid_t pid) {
  return "spare " + std::to_string(id) + " (pid " + std::to_string(pid) + ")";
}

// Node rank 0's spares, from spare `id` on (a node's spare ids step by the node count, 3), each
// SIGKILLed as it starts until `row` in a row died before they were ready, as node rank 0's
// agent says of each. The callers run with DDPRUN_SPARE_TEMPLATE=0: a spare forked from the
// template, warmed up already, can be ready a few ms after it starts, before this sees it. An
// exec'd one that is ready first all the same dies "after it was ready", and the row starts
// again. Returns the id of the spare after the last one killed.
int killUnreadySpares(ThreeNodes& job, int id, int row) {
  for (int inRow = 0, tries = 0; inRow < row; ++tries, id += 3) {
    REQUIRE(tries < 12);
    const pid_t p = waitForStartingSpare(*job.at[0], id, kJobTimeout);
    INFO("spare " << id);
    REQUIRE(job.showingOutput(p > 0));
    REQUIRE(::kill(p, SIGKILL) == 0);
    const std::string died = spareName(id, p) + " died ";
    REQUIRE(job.showingOutput(waitForOutput(*job.at[0], died, kJobTimeout)));
    inRow = job.at[0]->output().find(died + "before it was ready") != std::string::npos ? inRow + 1
                                                                                          : 0;
  }
  return id;
}

// Whether spare `id` has set its ready key in node rank 0's workers' store: what node rank 0's
// agent reads when the spare dies. The store's address and attempt are those rank 0 (`rank0`,
// node rank 0's own worker) was started with.
bool spareReadyKeySet(pid_t rank0, int id) {
  using namespace ddprun::rendezvous;
  const auto store = workerStore(rank0);
  const int attempt = std::stoi(startEnv(rank0, "TORCHELASTIC_RESTART_COUNT"));
  return store->check({recovery::attemptPrefix(attempt) + "/" + recovery::spareReadyKey(id)});
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
  ThreeNodes job(dir, {"--max-restarts=2", "--recovery=in-process", "--spares=1"},
                 {{"DDPRUN_SPARE_TEMPLATE", "0"}});
  REQUIRE(job.showingOutput(job.findRanks()));
  const pid_t moved = loseNodeRank1ToSpare0(job, dir);
  REQUIRE(job.showingOutput(waitForOutput(*job.at[0], "rank 1 joined generation 1", kJobTimeout)));
  // Node rank 0's next spares (3, 6, 9, ...) SIGKILLed as they start: three dead before they
  // were ready end the spares of its group, so none waits when the moved rank dies.
  killUnreadySpares(job, 3, 3);
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
  // DDPRUN_LOG_LEVEL=debug: the agent says when it asks for the budget (the check has passed).
  ThreeNodes job(dir, {"--max-restarts=2", "--recovery=in-process", "--spares=1"},
                 {{"DDPRUN_LOG_LEVEL", "debug"}, {"DDPRUN_SPARE_TEMPLATE", "0"}});
  REQUIRE(job.showingOutput(job.findRanks()));
  const pid_t moved = loseNodeRank1ToSpare0(job, dir);
  REQUIRE(job.showingOutput(waitForOutput(*job.at[0], "rank 1 joined generation 1", kJobTimeout)));
  // Node rank 0's next spares SIGKILLed as they start until two in a row died before they
  // were ready; the one after them is SIGSTOPped as it starts: it waits (exec'd) but is never
  // ready, so its death will be the third in a row and no other is started after it (a ready
  // spare's death would be replaced, and the new spare could take the rank). One stopped after
  // it had set its ready key is killed, and the row starts again.
  pid_t last = -1;
  int lastId = 3;
  for (int tries = 0; last < 0; ++tries) {
    REQUIRE(tries < 4);
    lastId = killUnreadySpares(job, lastId, 2);
    const pid_t p = waitForStartingSpare(*job.at[0], lastId, kJobTimeout);
    INFO("spare " << lastId);
    REQUIRE(job.showingOutput(p > 0));
    REQUIRE(::kill(p, SIGSTOP) == 0);
    for (int i = 0; i < 1000 && ddprun::testing::processState(p) != 'T'; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    REQUIRE(ddprun::testing::processState(p) == 'T');
    // A SET it sent just before it stopped reaches the store before this reads it.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!spareReadyKeySet(job.worker[0], lastId)) {
      // Out of SCHED_IDLE: on a busy machine an idle-priority process SIGKILLed in the window
      // below took longer to exit than the window stays open.
      const sched_param normal{};
      REQUIRE(::sched_setscheduler(p, SCHED_OTHER, &normal) == 0);
      last = p;
      break;
    }
    REQUIRE(::kill(p, SIGKILL) == 0);
    REQUIRE(job.showingOutput(
        waitForOutput(*job.at[0], spareName(lastId, p) + " died ", kJobTimeout)));
    lastId += 3;
  }
  const std::string lastSpare = spareName(lastId, last);
  // The window, held open: the rendezvous store stopped, so the budget's answer cannot come.
  // The moved rank dies (the check finds the stopped spare waiting and asks for the budget),
  // then that spare dies and its agent takes in its exit report; the store goes on within the
  // agents' keep-alive bound (3 x 0.3 s). Each step waits for the agent's own line, not for a
  // time: on a loaded machine the check, or the spare's exit report (its guard reaps it first),
  // came after a fixed sleep, and the budget's answer found the spare not yet known dead.
  REQUIRE(::kill(job.store->pid(), SIGSTOP) == 0);
  const auto storeStopped = std::chrono::steady_clock::now();
  REQUIRE(::kill(moved, SIGKILL) == 0);
  const bool asked = waitForOutput(*job.at[0], "rank 1 failed (signal 9 (SIGKILL)): asking the "
                                   "rendezvous", std::chrono::milliseconds(600));
  REQUIRE(::kill(last, SIGKILL) == 0);
  const bool spareSeen = waitForOutput(
      *job.at[0], lastSpare + " died before it was ready",
      std::chrono::milliseconds(800) - (std::chrono::steady_clock::now() - storeStopped));
  REQUIRE(::kill(job.store->pid(), SIGCONT) == 0);
  REQUIRE(job.showingOutput(asked));
  REQUIRE(job.showingOutput(spareSeen));
  const auto [out0, out2] = job.waitForEnd();
  INFO("node rank 0:\n" << out0 << "\nnode rank 2:\n" << out2);
  REQUIRE_THAT(out0, !Contains(lastSpare + " ready"));
  CHECK_THAT(out0, Contains(lastSpare + " died before it was ready (signal 9 (SIGKILL)), the "
                            "third in a row"));
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
