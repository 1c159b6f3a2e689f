// End to end: a lost node recovered in process (docs/recovery.md#a-lost-node) -- three real
// ddprun agents on loopback addresses 127.0.0.2, .3 and .4 (the c10d rendezvous on a ddprun-store
// of its own on 127.0.0.1, heartbeats every 0.3 s), one mnist_mlp rank each, node ranks in
// arrival order (the default rank_order): the test reads which agent holds which node rank from
// its worker's RANK. Node rank 1's agent and its worker are SIGKILLed together (the agent first:
// a lost machine); under `--recovery-policy=shrink` the rendezvous keeps the round (node rank 1
// lost in process), node rank 0's agent spends one restart and publishes a generation without
// node rank 1's rank, and the workers of node ranks 0 and 2 keep their processes: the group goes
// on at two ranks, node rank 2's worker renumbered 2 -> 1 by its agent, every sample of each
// epoch exactly once. (The store is not an agent's: with arrival ranks the agent that would host
// it may hold node rank 1, and the test's lost node must not take the rendezvous with it.)
// Under replace (the default) with --spares=1, node rank 0's agent names a ready spare of
// another node to take node rank 1's rank (one generation record); that spare's agent hands it
// the rank, the survivors keep their processes and the final weights are bit-identical to an
// uninterrupted run of the same three nodes; with no spare ready the round is re-formed, one
// line saying why. The fixture is three_nodes.h; a moved rank that dies later: moved_rank_test.cpp.
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

TEST_CASE("three nodes, replace, --spares=1: node rank 1 lost, its rank taken by a ready spare "
          "of another node, the survivors keep their processes, weights bit-identical",
          "[recovery][nodes][spares][slow]") {
  if (!haveData()) return skipWithoutData();
  const auto& reference = referenceRun();
  TempDir dir;
  ThreeNodes job(dir, {"--max-restarts=1", "--recovery=in-process", "--spares=1"});
  REQUIRE(job.showingOutput(job.findRanks()));
  // Spare ids are n x nodes + node rank: node rank 0's first is spare 0. Node rank 0's agent
  // takes the ready spares node by node from node rank 0: its own spare 0.
  REQUIRE(job.showingOutput(waitForOutput(*job.at[0], "spare 0 (pid ", kJobTimeout)));
  REQUIRE(job.showingOutput(
      waitForOutput(*job.at[0], "ready: loaded, waiting for a rank", kJobTimeout)));
  REQUIRE(job.showingOutput(waitForCheckpoint(*job.at[0], dir / "ckpt", 20, kJobTimeout)));
  const pid_t spare = sparePid(job.at[0]->pid(), 0, "mnist_mlp");
  REQUIRE(spare > 0);
  const pid_t r0 = job.worker[0], r2 = job.worker[2];
  const std::string lostAddr = job.addr(1);
  job.loseNodeRank1();
  REQUIRE(job.showingOutput(waitForOutput(*job.at[0], "rank 1 joined generation 1", kJobTimeout)));
  for (pid_t p : {r0, r2, spare}) CHECK(::kill(p, 0) == 0);
  const auto [out0, out2] = job.waitForEnd();
  INFO("node rank 0:\n" << out0 << "\nnode rank 2:\n" << out2);
  // One writer, one record, one restart spent; the spare's agent (here the writer's own) gives
  // it the rank in the slot after its node's own.
  CHECK(std::regex_search(out0, std::regex(lostInProcessRe(lostAddr) +
                                           R"(its rank\(s\) are taken by spares of other nodes )"
                                           R"(\(rank 1 by spare 0 of node rank 0\), the workers of )"
                                           R"(every other node keep running \(restart 1 of 1 )"
                                           R"(spent\))")));
  CHECK_THAT(out0, Contains("generation 1: spare 0 (pid " + std::to_string(spare) +
                            ") of this node takes rank 1 (local rank 1) of a lost node"));
  CHECK_THAT(out0, Contains("spare 0 (pid " + std::to_string(spare) + ") takes rank 1 (local "
                            "rank 1) in generation 1"));
  CHECK_THAT(out2, Contains("generation 1 of the worker group (another node recovered in "
                            "process; this node's workers keep running)"));
  checkSurvivorsKeptRunning(out0, out2);
  CHECK(bitIdentical(loadWeights(dir / "final.pt"), loadWeights(reference / "final.pt")));
}

TEST_CASE("three nodes, replace, --spares=1, one rank per node: the spare template loads (its "
          "pools held to one thread, the ranks' environment unchanged), a spare forked from it "
          "takes the lost node's rank, weights bit-identical",
          "[recovery][nodes][spares][slow]") {
  if (!haveData()) return skipWithoutData();
  const auto& reference = referenceRun();
  TempDir dir;
  ThreeNodes job(dir, {"--max-restarts=1", "--recovery=in-process", "--spares=1"});
  REQUIRE(job.showingOutput(job.findRanks()));
  // At --nproc-per-node=1 ddprun sets no OMP_NUM_THREADS for the ranks (torchrun's rule), so
  // OpenBLAS started its pool as LibTorch loaded and the template, which must have one thread
  // at init(), exited ("the program has 2 threads when it calls init()") on a 2-CPU machine.
  const pid_t templ = waitForNumber(*job.at[0], R"(spare template \(pid (\d+)\) ready: loaded)");
  INFO(job.at[0]->output());
  REQUIRE(templ > 0);
  CHECK(startEnv(templ, "OMP_NUM_THREADS") == "1");
  CHECK(startEnv(templ, "OPENBLAS_NUM_THREADS") == "1");
  // The ranks' own environment is what it was: nothing set for them at one worker per node.
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    CHECK(startEnv(job.worker[0], "OMP_NUM_THREADS").empty());
  }
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) {
    CHECK(startEnv(job.worker[0], "OPENBLAS_NUM_THREADS").empty());
  }
  // Spare 0 is exec'd (the template was still loading); killed while it waits, it is replaced
  // by spare 3 (ids: n x 3 nodes + node rank), a fork of the template.
  REQUIRE(job.showingOutput(
      waitForOutput(*job.at[0], "ready: loaded, waiting for a rank", kJobTimeout)));
  const pid_t spare0 = sparePid(job.at[0]->pid(), 0, "mnist_mlp");
  REQUIRE(spare0 > 0);
  REQUIRE(::kill(spare0, SIGKILL) == 0);
  const pid_t forked = waitForNumber(*job.at[0], R"(spare 3 \(pid (\d+)\) forked from the spare )"
                                                 R"(template \(pid )" + std::to_string(templ));
  REQUIRE(job.showingOutput(forked > 0));
  REQUIRE(job.showingOutput(waitForOutput(
      *job.at[0], "spare 3 (pid " + std::to_string(forked) + ") ready: loaded", kJobTimeout)));
  REQUIRE(job.showingOutput(waitForCheckpoint(*job.at[0], dir / "ckpt", 20, kJobTimeout)));
  const pid_t r0 = job.worker[0], r2 = job.worker[2];
  job.loseNodeRank1();
  REQUIRE(job.showingOutput(waitForOutput(*job.at[0], "rank 1 joined generation 1", kJobTimeout)));
  for (pid_t p : {r0, r2, forked}) CHECK(::kill(p, 0) == 0);
  const auto [out0, out2] = job.waitForEnd();
  INFO("node rank 0:\n" << out0 << "\nnode rank 2:\n" << out2);
  CHECK_THAT(out0, !Contains("threads when it calls init()"));
  CHECK_THAT(out0, !Contains("the spare template (pid " + std::to_string(templ) + ") exited"));
  // The fork sized its pools as a rank's process: LibTorch by its own rule, OpenBLAS from the
  // CPUs (no *_NUM_THREADS in a rank's environment here), not the template's one thread.
  std::smatch m;
  REQUIRE(std::regex_search(out0, m, std::regex(
      "spare 3 \\(pid " + std::to_string(forked) + R"(\): thread pools as a process started )"
      R"(with its environment: LibTorch \d+ threads?(, OpenBLAS (\d+))?)")));
  if (m[1].matched && std::getenv("OPENBLAS_NUM_THREADS") == nullptr &&
      std::getenv("OMP_NUM_THREADS") == nullptr && std::thread::hardware_concurrency() > 1) {
    CHECK(std::stoi(m[2]) > 1);
  }
  CHECK(std::regex_search(out0, std::regex(R"(its rank\(s\) are taken by spares of other nodes )"
                                           R"(\(rank 1 by spare 3 of node rank 0\), the workers of )"
                                           R"(every other node keep running \(restart 1 of 1 )"
                                           R"(spent\))")));
  CHECK_THAT(out0, Contains("generation 1: spare 3 (pid " + std::to_string(forked) +
                            ") of this node takes rank 1 (local rank 1) of a lost node"));
  checkSurvivorsKeptRunning(out0, out2);
  CHECK(bitIdentical(loadWeights(dir / "final.pt"), loadWeights(reference / "final.pt")));
}

TEST_CASE("three nodes, replace, --spares=1, no spare ready: node rank 1 lost, the round is "
          "re-formed without it (no restart spent), one line naming why",
          "[recovery][nodes][spares][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  ThreeNodes job(dir, {"--max-restarts=1", "--recovery=in-process", "--spares=1"});
  REQUIRE(job.showingOutput(job.findRanks()));
  // The survivors' spares are stopped as soon as they appear (exec'd, as the first spares are
  // while the template loads, or forked from it), long before they could load LibTorch and say
  // they are ready: none is ready when node rank 1 is lost.
  const pid_t s0 = waitForStartingSpare(*job.at[0], 0, kJobTimeout);
  const pid_t s2 = waitForStartingSpare(*job.at[2], 2, kJobTimeout);
  REQUIRE(job.showingOutput(s0 > 0));
  REQUIRE(job.showingOutput(s2 > 0));
  REQUIRE(::kill(s0, SIGSTOP) == 0);
  REQUIRE(::kill(s2, SIGSTOP) == 0);
  REQUIRE(job.showingOutput(waitForCheckpoint(*job.at[0], dir / "ckpt", 20, kJobTimeout)));
  job.loseNodeRank1();
  REQUIRE(job.showingOutput(waitForOutput(*job.at[0], "need as many ready spares", kJobTimeout)));
  // Our own stopped spares: let them take the group's stop.
  for (pid_t p : {s0, s2}) ::kill(p, SIGCONT);
  const auto [out0, out2] = job.waitForEnd();
  INFO("node rank 0:\n" << out0 << "\nnode rank 2:\n" << out2);
  CHECK(std::regex_search(out0, std::regex(R"(node rank 1 \(\S+\) was lost; it is not recovered )"
                                           R"(in process: --recovery-policy=replace: its 1 )"
                                           R"(rank\(s\) need as many ready spares on the other )"
                                           R"(nodes, 0 are ready; restarting the group without it )"
                                           R"(\(no restart spent\))")));
  CHECK_THAT(out0 + out2, !Contains("recovering in process (generation"));
  CHECK_THAT(out0 + out2, Contains("restarting the workers (membership changed, no restart spent)"));
  CHECK_THAT(out0 + out2, Contains("resumed from checkpoint"));
  CHECK_THAT(out0 + out2, Contains("done: "));
}

TEST_CASE("three nodes, shrink: node rank 1's agent and worker SIGKILLed, node rank 0 recovers "
          "the lost node in process, the workers of node ranks 0 and 2 keep their processes, "
          "exactly once",
          "[recovery][nodes][shrink][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  ThreeNodes job(dir, {"--max-restarts=1", "--recovery=in-process", "--recovery-policy=shrink"},
                 {{"DDPRUN_SAMPLE_LOG", dir / "samples"}});
  REQUIRE(job.showingOutput(job.findRanks()));
  REQUIRE(job.showingOutput(waitForCheckpoint(*job.at[0], dir / "ckpt", 20, kJobTimeout)));
  const pid_t r0 = job.worker[0], r2 = job.worker[2];
  const std::string lostAddr = job.addr(1);
  job.loseNodeRank1();
  REQUIRE(job.showingOutput(waitForOutput(
      *job.at[2], "as rank 1 of 2 (was rank 2 of 3; the group shrank)", kJobTimeout)));
  for (pid_t p : {r0, r2}) CHECK(::kill(p, 0) == 0);
  const auto [out0, out2] = job.waitForEnd();
  INFO("node rank 0:\n" << out0 << "\nnode rank 2:\n" << out2);
  // One writer, node rank 0's agent: one restart spent, node rank 1's rank removed.
  CHECK(std::regex_search(out0, std::regex(lostInProcessRe(lostAddr) +
                                           R"(its rank\(s\) 1 are removed, the group shrinks from 3 )"
                                           R"(to 2 rank\(s\), the workers of every other node )"
                                           R"(keep running \(restart 1 of 1 spent\))")));
  CHECK_THAT(out2, Contains("generation 1 of the worker group (another node recovered in "
                            "process; this node's workers keep running)"));
  CHECK_THAT(out0 + out2, !Contains("restarting the worker"));
  CHECK_THAT(out0, !Contains("resumed from checkpoint"));
  CHECK(std::regex_search(out0, std::regex(R"(rank 0 recovered in process in \d+ ms)")));
  CHECK_THAT(out0, Contains("done: "));
  // Node 2's agent renumbered its worker: its console prefix says rank 1 after the shrink.
  CHECK(std::regex_search(out2, std::regex(R"(\[rank 1\]: \[ddprun W [0-9:.]+ runtime rank 1\] )"
                                           R"(rank 1 recovered in process)")));
  const std::string log = dir / "samples";
  for (int e = 0; e < kEpochs; ++e) {
    checkEpochExactlyOnce(log, e, epochSamples(log, e).lastWorld,
                          {.examples = kExamples, .batch = kBatch, .seed = kSeed});
  }
  CHECK(epochSamples(log, kEpochs - 1).lastWorld == 2);
}

TEST_CASE("three nodes, shrink:3: node rank 1 lost below the job's minimum, the group "
          "restarts without it (no restart spent), one line naming why",
          "[recovery][nodes][shrink][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  ThreeNodes job(dir, {"--max-restarts=1", "--recovery=in-process", "--recovery-policy=shrink:3"});
  REQUIRE(job.showingOutput(job.findRanks()));
  REQUIRE(job.showingOutput(waitForCheckpoint(*job.at[0], dir / "ckpt", 20, kJobTimeout)));
  job.loseNodeRank1();
  const auto [out0, out2] = job.waitForEnd();
  INFO("node rank 0:\n" << out0 << "\nnode rank 2:\n" << out2);
  CHECK(std::regex_search(out0, std::regex(R"(node rank 1 \(\S+\) was lost; it is not recovered )"
                                           R"(in process: --recovery-policy=shrink: without its 1 )"
                                           R"(rank\(s\) the group would have 2, below the job's )"
                                           R"(minimum of 3; restarting the group without it \(no )"
                                           R"(restart spent\))")));
  CHECK_THAT(out0 + out2, Contains("restarting the workers (membership changed, no restart spent)"));
  // The group restarts in a re-formed round, whose node ranks are in arrival order (the
  // default): rank 0, which resumes and reports, runs on whichever survivor re-joined first.
  CHECK_THAT(out0 + out2, Contains("resumed from checkpoint"));
  CHECK_THAT(out0 + out2, Contains("done: "));
}
