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
// line saying why.
#include "tests/support/catch_torch.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <arpa/inet.h>

#include <cerrno>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>

#include "fashion_mnist.h"
#include "job_runner.h"
#include "sample_log_check.h"
#include "test_files.h"
#include "trained_weights.h"
#include "tests/support/skip.h"

using namespace ddprun::trainers;
using namespace ddprun::trainers::testing;
using Catch::Matchers::Contains;

namespace {

const std::string kBin = DDPRUN_BIN_DIR;
constexpr auto kJobTimeout = std::chrono::seconds(240);
constexpr int64_t kExamples = 4096;
constexpr int64_t kBatch = 16;
constexpr int kEpochs = 2;
constexpr uint64_t kSeed = 11;
// Fast eviction (0.3 s x 3 missed beats); the store host waits 2 s, not 30, for the lost node
// to learn that the job ended (it never will: it is dead).
const std::string kConf =
    "heartbeat=0.3,missed_heartbeats=3,last_call_timeout=20,join_timeout=60,read_timeout=10,"
    "close_timeout=2,exit_barrier_timeout=60";


// The agent on 127.0.0.<2 + node>, meeting the others at the ddprun-store on 127.0.0.1:`port`.
std::vector<std::string> agent(int node, int port, const std::string& dir,
                               std::vector<std::string> flags) {
  const std::string addr = "127.0.0." + std::to_string(2 + node);
  std::vector<std::string> argv = {kBin + "/ddprun", "--nnodes=2:3", "--nproc-per-node=1",
                                   "--rdzv-backend=c10d",
                                   "--rdzv-endpoint=127.0.0.1:" + std::to_string(port),
                                   "--local-addr=" + addr, "--rdzv-id=node-loss",
                                   "--rdzv-conf=" + kConf + ",is_host=false"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  const auto trainer = mlpCommand(
      {.dir = dir, .batch = kBatch, .epochs = kEpochs, .examples = kExamples, .seed = kSeed});
  argv.insert(argv.end(), trainer.begin(), trainer.end());
  return argv;
}

struct ThreeNodes {
  std::unique_ptr<Job> store;  // declared first: it outlives the agents
  std::unique_ptr<Job> node[3];
  // After findRanks(): the agent that holds node rank k, and its worker (one rank per node, so
  // node rank k's worker is global rank k).
  Job* at[3] = {nullptr, nullptr, nullptr};
  pid_t worker[3] = {-1, -1, -1};
  ThreeNodes(const TempDir& dir, std::vector<std::string> flags,
             std::map<std::string, std::string> env = {}) {
    const int port = freePort("127.0.0.1");
    store = std::make_unique<Job>(
        std::vector<std::string>{kBin + "/ddprun-store", "--host", "127.0.0.1", "--port",
                                 std::to_string(port)},
        std::map<std::string, std::string>{}, dir / "store.log");
    REQUIRE(waitForOutput(*store, "ddprun-store listening on", std::chrono::seconds(30)));
    for (int n = 0; n < 3; ++n) {
      node[n] = std::make_unique<Job>(agent(n, port, dir.path(), flags), env,
                                      dir / ("node" + std::to_string(n) + ".log"));
    }
  }
  // Which agent holds which node rank in the first round (arrival order): from its worker's RANK.
  bool findRanks() {
    const auto deadline = std::chrono::steady_clock::now() + kJobTimeout;
    int found = 0;
    while (found < 3 && std::chrono::steady_clock::now() < deadline) {
      for (int k = 0; k < 3; ++k) {
        for (int n = 0; n < 3 && !at[k]; ++n) {
          if (node[n]->exited()) return false;
          const pid_t p = workerPid(node[n]->pid(), k, "mnist_mlp");
          if (p > 0) {
            at[k] = node[n].get();
            worker[k] = p;
            ++found;
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return found == 3;
  }
  // The address of the agent that holds node rank k ("127.0.0.<2 + n>").
  std::string addr(int k) const {
    for (int n = 0; n < 3; ++n)
      if (node[n].get() == at[k]) return "127.0.0." + std::to_string(2 + n);
    return "?";
  }
  // Node rank 1 is lost: its agent first (no report of the worker's death can leave it), then
  // its worker (only processes of this test's own ddprun). Says who held which node rank.
  void loseNodeRank1() {
    std::cout << "node ranks 0, 1, 2: " << addr(0) << ", " << addr(1) << ", " << addr(2)
              << std::endl;
    REQUIRE(::kill(at[1]->pid(), SIGKILL) == 0);
    REQUIRE(::kill(worker[1], SIGKILL) == 0);
  }
  // Every agent's end (bounded); the survivors' (node ranks 0 and 2) exit codes and output.
  struct End {
    int code0, code2;
    std::string out0, out2;
  };
  End waitForEnd() {
    End e;
    e.code0 = at[0]->wait(kJobTimeout);
    e.code2 = at[2]->wait(kJobTimeout);
    at[1]->wait(kJobTimeout);
    e.out0 = at[0]->output();
    e.out2 = at[2]->output();
    return e;
  }
};

// The uninterrupted three-node run (once per test process).
const TempDir& referenceRun() {
  static std::unique_ptr<TempDir> dir;
  if (dir) return *dir;
  dir = std::make_unique<TempDir>();
  ThreeNodes job(*dir, {});
  int codes[3];
  for (int n = 0; n < 3; ++n) codes[n] = job.node[n]->wait(kJobTimeout);
  for (int n = 0; n < 3; ++n) {
    INFO(job.node[n]->output());
    REQUIRE(codes[n] == 0);
  }
  return *dir;
}

// The pid of hot spare `id` under `agent`, as soon as it is exec'd (bounded), or -1.
pid_t waitForSpare(Job& agent, int id) {
  const auto deadline = std::chrono::steady_clock::now() + kJobTimeout;
  while (std::chrono::steady_clock::now() < deadline && !agent.exited()) {
    const pid_t p = sparePid(agent.pid(), id, "mnist_mlp");
    if (p > 0) return p;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return -1;
}

std::string escaped(std::string addr) {
  for (size_t i = addr.find('.'); i != std::string::npos; i = addr.find('.', i + 2))
    addr.insert(i, "\\");
  return addr;
}

// The first number matched by group 1 of `re` in the agent's output, waited for (bounded); -1
// when the agent exited first.
pid_t waitForNumber(Job& agent, const std::string& re) {
  const std::regex pattern(re);
  const auto deadline = std::chrono::steady_clock::now() + kJobTimeout;
  while (std::chrono::steady_clock::now() < deadline && !agent.exited()) {
    std::smatch m;
    const std::string out = agent.output();
    if (std::regex_search(out, m, pattern)) return static_cast<pid_t>(std::stol(m[1]));
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return -1;
}

// The value of `name` in the environment `pid` was started with ("" when absent; "?" when
// unreadable).
std::string startEnv(pid_t pid, const std::string& name) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ");
  if (!in) return "?";
  for (std::string e; std::getline(in, e, '\0');) {
    if (e.rfind(name + "=", 0) == 0) return e.substr(name.size() + 1);
  }
  return "";
}

// The survivors (node ranks 0 and 2) never restarted: the same processes recovered in process
// and ran to the end, no checkpoint was read.
void checkSurvivorsKeptRunning(const std::string& out0, const std::string& out2) {
  CHECK_THAT(out0 + out2, !Contains("restarting the worker"));
  CHECK_THAT(out0, !Contains("resumed from checkpoint"));
  CHECK(std::regex_search(out0, std::regex(R"(rank 0 recovered in process in \d+ ms)")));
  CHECK(std::regex_search(out2, std::regex(R"(rank 2 recovered in process in \d+ ms)")));
  CHECK_THAT(out0, Contains("done: "));
}

}  // namespace

TEST_CASE("three nodes, replace, --spares=1: node rank 1 lost, its rank taken by a ready spare "
          "of another node, the survivors keep their processes, weights bit-identical",
          "[recovery][nodes][spares][slow]") {
  if (!haveData()) return skipWithoutData();
  const auto& reference = referenceRun();
  TempDir dir;
  ThreeNodes job(dir, {"--max-restarts=1", "--recovery=in-process", "--spares=1"});
  REQUIRE(job.findRanks());
  // Spare ids are n x nodes + node rank: node rank 0's first is spare 0. Node rank 0's agent
  // takes the ready spares node by node from node rank 0: its own spare 0.
  REQUIRE(waitForOutput(*job.at[0], "spare 0 (pid ", kJobTimeout));
  REQUIRE(waitForOutput(*job.at[0], "ready: loaded, waiting for a rank", kJobTimeout));
  REQUIRE(waitForCheckpoint(*job.at[0], dir / "ckpt", 20, kJobTimeout));
  const pid_t spare = sparePid(job.at[0]->pid(), 0, "mnist_mlp");
  REQUIRE(spare > 0);
  const pid_t r0 = job.worker[0], r2 = job.worker[2];
  const std::string lostAddr = job.addr(1);
  job.loseNodeRank1();
  REQUIRE(waitForOutput(*job.at[0], "rank 1 joined generation 1", kJobTimeout));
  for (pid_t p : {r0, r2, spare}) CHECK(::kill(p, 0) == 0);
  const auto [a, c, out0, out2] = job.waitForEnd();
  INFO("node rank 0:\n" << out0 << "\nnode rank 2:\n" << out2);
  REQUIRE(a == 0);
  REQUIRE(c == 0);
  // One writer, one record, one restart spent; the spare's agent (here the writer's own) gives
  // it the rank in the slot after its node's own.
  CHECK(std::regex_search(out0, std::regex(R"(node rank 1 was lost: node )" + escaped(lostAddr) +
                                           R"(-\S+ was evicted: no heartbeat for 900 ms \(lost in )"
                                           R"(process\); recovering in process \(generation 1\): )"
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
  REQUIRE(job.findRanks());
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
  REQUIRE(waitForOutput(*job.at[0], "ready: loaded, waiting for a rank", kJobTimeout));
  const pid_t spare0 = sparePid(job.at[0]->pid(), 0, "mnist_mlp");
  REQUIRE(spare0 > 0);
  REQUIRE(::kill(spare0, SIGKILL) == 0);
  const pid_t forked = waitForNumber(*job.at[0], R"(spare 3 \(pid (\d+)\) forked from the spare )"
                                                 R"(template \(pid )" + std::to_string(templ));
  REQUIRE(forked > 0);
  REQUIRE(waitForOutput(*job.at[0], "spare 3 (pid " + std::to_string(forked) + ") ready: loaded",
                        kJobTimeout));
  REQUIRE(waitForCheckpoint(*job.at[0], dir / "ckpt", 20, kJobTimeout));
  const pid_t r0 = job.worker[0], r2 = job.worker[2];
  job.loseNodeRank1();
  REQUIRE(waitForOutput(*job.at[0], "rank 1 joined generation 1", kJobTimeout));
  for (pid_t p : {r0, r2, forked}) CHECK(::kill(p, 0) == 0);
  const auto [a, c, out0, out2] = job.waitForEnd();
  INFO("node rank 0:\n" << out0 << "\nnode rank 2:\n" << out2);
  REQUIRE(a == 0);
  REQUIRE(c == 0);
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

TEST_CASE("three nodes, replace, --spares=1: node rank 1 lost, its rank moved to node rank 0's "
          "spare, then the moved rank SIGKILLed: node rank 0's next spare takes it in process, "
          "weights bit-identical", "[recovery][nodes][spares][slow]") {
  if (!haveData()) return skipWithoutData();
  const auto& reference = referenceRun();
  TempDir dir;
  ThreeNodes job(dir, {"--max-restarts=2", "--recovery=in-process", "--spares=1"});
  REQUIRE(job.findRanks());
  REQUIRE(waitForOutput(*job.at[0], "spare 0 (pid ", kJobTimeout));
  REQUIRE(waitForOutput(*job.at[0], "ready: loaded, waiting for a rank", kJobTimeout));
  const pid_t moved = sparePid(job.at[0]->pid(), 0, "mnist_mlp");
  REQUIRE(moved > 0);
  REQUIRE(waitForCheckpoint(*job.at[0], dir / "ckpt", 20, kJobTimeout));
  const pid_t r0 = job.worker[0], r2 = job.worker[2];
  job.loseNodeRank1();
  REQUIRE(waitForOutput(*job.at[0], "rank 1 joined generation 1", kJobTimeout));
  // Node rank 0 starts its next spare (3) as spare 0 takes the moved rank; once it is ready,
  // the moved rank (spare 0's process, local rank 1 of node rank 0) is SIGKILLed.
  const pid_t next = waitForNumber(*job.at[0], R"(spare 3 \(pid (\d+)\) ready: loaded)");
  REQUIRE(next > 0);
  REQUIRE(::kill(moved, SIGKILL) == 0);
  REQUIRE(waitForOutput(*job.at[0], "rank 1 joined generation 2", kJobTimeout));
  for (pid_t p : {r0, r2, next}) CHECK(::kill(p, 0) == 0);
  const auto [a, c, out0, out2] = job.waitForEnd();
  INFO("node rank 0:\n" << out0 << "\nnode rank 2:\n" << out2);
  REQUIRE(a == 0);
  REQUIRE(c == 0);
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
  REQUIRE(job.findRanks());
  REQUIRE(waitForOutput(*job.at[0], "ready: loaded, waiting for a rank", kJobTimeout));
  const pid_t moved = sparePid(job.at[0]->pid(), 0, "mnist_mlp");
  REQUIRE(moved > 0);
  REQUIRE(waitForCheckpoint(*job.at[0], dir / "ckpt", 20, kJobTimeout));
  job.loseNodeRank1();
  // The spare dies the moment its agent has given it the rank: before (or while) it heals from
  // a survivor's memory, with the survivors waiting for it in generation 1.
  REQUIRE(waitForOutput(*job.at[0], "generation 1: spare 0 (pid " + std::to_string(moved) +
                                        ") of this node takes rank 1", kJobTimeout));
  REQUIRE(::kill(moved, SIGKILL) == 0);
  const auto [a, c, out0, out2] = job.waitForEnd();
  INFO("node rank 0:\n" << out0 << "\nnode rank 2:\n" << out2);
  REQUIRE(a == 0);
  REQUIRE(c == 0);
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
  REQUIRE(job.findRanks());
  REQUIRE(waitForOutput(*job.at[0], "ready: loaded, waiting for a rank", kJobTimeout));
  const pid_t moved = sparePid(job.at[0]->pid(), 0, "mnist_mlp");
  REQUIRE(moved > 0);
  REQUIRE(waitForCheckpoint(*job.at[0], dir / "ckpt", 20, kJobTimeout));
  job.loseNodeRank1();
  REQUIRE(waitForOutput(*job.at[0], "rank 1 joined generation 1", kJobTimeout));
  // Node rank 0's next spares (3, 6, 9) SIGKILLed as they start: three dead before they were
  // ready end the spares of its group, so none waits when the moved rank dies.
  for (int id : {3, 6, 9}) {
    pid_t p = -1;
    const auto deadline = std::chrono::steady_clock::now() + kJobTimeout;
    while (p <= 0 && std::chrono::steady_clock::now() < deadline && !job.at[0]->exited()) {
      p = forkedSparePid(job.at[0]->output(), id);
      if (p <= 0) p = sparePid(job.at[0]->pid(), id, "mnist_mlp");
      if (p <= 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    INFO("spare " << id);
    REQUIRE(p > 0);
    REQUIRE(::kill(p, SIGKILL) == 0);
  }
  REQUIRE(waitForOutput(*job.at[0], "the third in a row: no more spares for this group",
                        kJobTimeout));
  REQUIRE(::kill(moved, SIGKILL) == 0);
  const auto [a, c, out0, out2] = job.waitForEnd();
  INFO("node rank 0:\n" << out0 << "\nnode rank 2:\n" << out2);
  // Before the check came ahead of the budget, the recovery spent restart 2 of 2 and then
  // restarted the group, a failure reported afresh with no restart left: the job failed.
  REQUIRE(a == 0);
  REQUIRE(c == 0);
  CHECK_THAT(out0, Contains("--recovery=in-process: rank 1 had moved to this node from a lost "
                            "node, and no spare of this node is waiting to take it"));
  CHECK_THAT(out0, !Contains("recovering in process (generation 2)"));
  CHECK_THAT(out0, !Contains("in-process recovery of rank 1 failed"));
  CHECK_THAT(out0 + out2, Contains("resumed from checkpoint"));
  CHECK_THAT(out0 + out2, Contains("done: "));
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

TEST_CASE("three nodes, replace, --spares=1: the moved rank's waiting spare dies between the "
          "check and the budget's answer, the group restarts with one line naming it",
          "[recovery][nodes][spares][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  ThreeNodes job(dir, {"--max-restarts=3", "--recovery=in-process", "--spares=1"});
  REQUIRE(job.findRanks());
  REQUIRE(waitForOutput(*job.at[0], "ready: loaded, waiting for a rank", kJobTimeout));
  const pid_t moved = sparePid(job.at[0]->pid(), 0, "mnist_mlp");
  REQUIRE(moved > 0);
  REQUIRE(waitForCheckpoint(*job.at[0], dir / "ckpt", 20, kJobTimeout));
  job.loseNodeRank1();
  REQUIRE(waitForOutput(*job.at[0], "rank 1 joined generation 1", kJobTimeout));
  // Node rank 0's next spares 3 and 6 SIGKILLed as they start (two dead before they were ready);
  // spare 9 waits, and its death will be the third in a row: no other is started after it.
  pid_t last = -1;
  for (int id : {3, 6, 9}) {
    pid_t p = -1;
    const auto deadline = std::chrono::steady_clock::now() + kJobTimeout;
    while (p <= 0 && std::chrono::steady_clock::now() < deadline && !job.at[0]->exited()) {
      p = forkedSparePid(job.at[0]->output(), id);
      if (p <= 0) p = sparePid(job.at[0]->pid(), id, "mnist_mlp");
      if (p <= 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    INFO("spare " << id);
    REQUIRE(p > 0);
    if (id != 9) REQUIRE(::kill(p, SIGKILL) == 0);
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
  REQUIRE(reaped);
  REQUIRE(spareReaped);
  const auto [a, c, out0, out2] = job.waitForEnd();
  INFO("node rank 0:\n" << out0 << "\nnode rank 2:\n" << out2);
  REQUIRE(a == 0);
  REQUIRE(c == 0);
  CHECK_THAT(out0, Contains("in-process recovery of rank 1 failed: rank 1 had moved to this "
                            "node from a lost node, and the spare of this node that was waiting "
                            "to take it died"));
  CHECK_THAT(out0, !Contains("--recovery=in-process: rank 1 had moved"));  // not the check's
  CHECK_THAT(out0, !Contains("recovering in process (generation 2)"));
  CHECK_THAT(out0 + out2, Contains("resumed from checkpoint"));
  CHECK_THAT(out0 + out2, Contains("done: "));
}

TEST_CASE("three nodes, replace, --spares=1, no spare ready: node rank 1 lost, the round is "
          "re-formed without it (no restart spent), one line naming why",
          "[recovery][nodes][spares][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  ThreeNodes job(dir, {"--max-restarts=1", "--recovery=in-process", "--spares=1"});
  REQUIRE(job.findRanks());
  // The survivors' spares are stopped as soon as they are exec'd, long before they could load
  // LibTorch and say they are ready: none is ready when node rank 1 is lost.
  const pid_t s0 = waitForSpare(*job.at[0], 0), s2 = waitForSpare(*job.at[2], 2);
  REQUIRE(s0 > 0);
  REQUIRE(s2 > 0);
  REQUIRE(::kill(s0, SIGSTOP) == 0);
  REQUIRE(::kill(s2, SIGSTOP) == 0);
  REQUIRE(waitForCheckpoint(*job.at[0], dir / "ckpt", 20, kJobTimeout));
  job.loseNodeRank1();
  REQUIRE(waitForOutput(*job.at[0], "need as many ready spares", kJobTimeout));
  // Our own stopped spares: let them take the group's stop.
  for (pid_t p : {s0, s2}) ::kill(p, SIGCONT);
  const auto [a, c, out0, out2] = job.waitForEnd();
  INFO("node rank 0:\n" << out0 << "\nnode rank 2:\n" << out2);
  REQUIRE(a == 0);
  REQUIRE(c == 0);
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
  REQUIRE(job.findRanks());
  REQUIRE(waitForCheckpoint(*job.at[0], dir / "ckpt", 20, kJobTimeout));
  const pid_t r0 = job.worker[0], r2 = job.worker[2];
  const std::string lostAddr = job.addr(1);
  job.loseNodeRank1();
  REQUIRE(waitForOutput(*job.at[2], "as rank 1 of 2 (was rank 2 of 3; the group shrank)",
                        kJobTimeout));
  for (pid_t p : {r0, r2}) CHECK(::kill(p, 0) == 0);
  const auto [a, c, out0, out2] = job.waitForEnd();
  INFO("node rank 0:\n" << out0 << "\nnode rank 2:\n" << out2);
  REQUIRE(a == 0);
  REQUIRE(c == 0);
  // One writer, node rank 0's agent: one restart spent, node rank 1's rank removed.
  CHECK(std::regex_search(out0, std::regex(R"(node rank 1 was lost: node )" + escaped(lostAddr) +
                                           R"(-\S+ was )"
                                           R"(evicted: no heartbeat for 900 ms \(lost in process\); )"
                                           R"(recovering in process \(generation 1\): its )"
                                           R"(rank\(s\) 1 are removed, the group shrinks from 3 )"
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
  REQUIRE(job.findRanks());
  REQUIRE(waitForCheckpoint(*job.at[0], dir / "ckpt", 20, kJobTimeout));
  job.loseNodeRank1();
  const auto [a, c, out0, out2] = job.waitForEnd();
  INFO("node rank 0:\n" << out0 << "\nnode rank 2:\n" << out2);
  REQUIRE(a == 0);
  REQUIRE(c == 0);
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
