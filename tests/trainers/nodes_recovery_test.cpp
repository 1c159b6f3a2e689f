// End to end: in-process recovery on a job of two nodes (docs/recovery.md#several-nodes) -- two
// real ddprun agents on loopback addresses 127.0.0.2 and 127.0.0.3 (the static rendezvous: node
// rank 0 is 127.0.0.2, whose agent hosts the workers' store), two mnist_mlp ranks each, real
// SIGKILLs of a worker of node 1:
//   - replace: a new rank 2 is started by node 1's agent, node 0's workers (and node 1's other
//     one) keep their processes, no group restart, weights bit-identical to an uninterrupted
//     run of the same two nodes;
//   - shrink: the group goes on at three ranks across the two nodes, node 1's other worker
//     renumbered by its agent, every sample of each epoch exactly once.
#include "tests/support/catch_torch.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <arpa/inet.h>

#include <array>
#include <filesystem>
#include <map>
#include <regex>

#include "fashion_mnist.h"
#include "job_runner.h"
#include "sample_log_check.h"
#include "test_files.h"
#include "trained_weights.h"
#include "tests/support/skip.h"
#include "trainers/mnist_data.h"

using namespace ddprun::trainers;
using namespace ddprun::trainers::testing;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

const std::string kBin = DDPRUN_BIN_DIR;
constexpr auto kJobTimeout = std::chrono::seconds(240);
constexpr int64_t kExamples = 4096;
constexpr int64_t kBatch = 16;
// 4 (3-7 s of training here): a test that waits for a spare to load (beside 4 ranks and the
// templates on two CPUs) and then kills a rank found the 2-epoch job over on a slow machine.
constexpr int kEpochs = 4;
constexpr uint64_t kSeed = 11;


// The agent of node `node` (0: 127.0.0.2, 1: 127.0.0.3) of a two-node job, two ranks each.
std::vector<std::string> agent(int node, int port, const std::string& dir,
                               std::vector<std::string> flags, int epochs) {
  const std::string addr = node == 0 ? "127.0.0.2" : "127.0.0.3";
  std::vector<std::string> argv = {kBin + "/ddprun", "--nnodes=2", "--nproc-per-node=2",
                                   "--rdzv-backend=static", "--master-addr=127.0.0.2",
                                   "--master-port=" + std::to_string(port),
                                   "--node-rank=" + std::to_string(node), "--local-addr=" + addr,
                                   "--rdzv-id=nodes-recovery"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  const auto trainer = mlpCommand(
      {.dir = dir, .batch = kBatch, .epochs = epochs, .examples = kExamples, .seed = kSeed});
  argv.insert(argv.end(), trainer.begin(), trainer.end());
  return argv;
}

struct TwoNodes {
  std::unique_ptr<Job> node0, node1;
  TwoNodes(const TempDir& dir, std::vector<std::string> flags,
           std::map<std::string, std::string> env = {}, int epochs = kEpochs) {
    const int port = freePort("127.0.0.2");
    node0 = std::make_unique<Job>(agent(0, port, dir.path(), flags, epochs), env,
                                  dir / "node0.log");
    node1 = std::make_unique<Job>(agent(1, port, dir.path(), flags, epochs), env,
                                  dir / "node1.log");
  }
  // `ok`, passed on; when it is false, both agents' output so far goes into the message of the
  // assertion being evaluated (job_runner.h's showingOutput).
  bool showingOutput(bool ok) const {
    return testing::showingOutput(ok, {{"node 0", node0.get()}, {"node 1", node1.get()}});
  }
  // Both agents' ends (bounded), each required to exit 0 (both outputs in the failure's
  // message); returns node 0's output and node 1's.
  std::pair<std::string, std::string> finish() {
    const int a = node0->wait(kJobTimeout);
    const int b = node1->wait(kJobTimeout);
    const std::string out0 = node0->output(), out1 = node1->output();
    INFO("node 0:\n" << out0 << "\nnode 1:\n" << out1);
    REQUIRE(a == 0);
    REQUIRE(b == 0);
    return {out0, out1};
  }
};

// The uninterrupted two-node run (once per test process).
const TempDir& referenceRun() {
  static std::unique_ptr<TempDir> dir;
  if (dir) return *dir;
  dir = std::make_unique<TempDir>();
  TwoNodes job(*dir, {});
  const auto [out0, out1] = job.finish();
  INFO(out0 << "\n" << out1);
  REQUIRE_THAT(out0, Contains("done: "));
  return *dir;
}

pid_t waitForWorker(Job& job, int rank) {
  const auto deadline = std::chrono::steady_clock::now() + kJobTimeout;
  while (std::chrono::steady_clock::now() < deadline && !job.exited()) {
    const pid_t p = workerPid(job.pid(), rank, "mnist_mlp");
    if (p > 0) return p;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return -1;
}

// Once node 0 has checkpointed step 20: the pids of ranks 0 and 1 (node 0) and 2 and 3 (node 1),
// each required found.
std::array<pid_t, 4> workersAfterCheckpoint(TwoNodes& job, const TempDir& dir) {
  REQUIRE(job.showingOutput(waitForCheckpoint(*job.node0, dir / "ckpt", 20, kJobTimeout)));
  std::array<pid_t, 4> r;
  for (int k = 0; k < 4; ++k) r[k] = waitForWorker(k < 2 ? *job.node0 : *job.node1, k);
  for (int k = 0; k < 4; ++k) {
    INFO("rank " << k);
    REQUIRE(job.showingOutput(r[k] > 0));
  }
  return r;
}

// The pid in the line "spare <id> (pid P) ready: loaded" of `job`'s output (its spare set its
// ready key), waited for (bounded); -1 when the agent exited first.
pid_t waitForReadySpare(Job& job, int id) {
  const std::regex ready("spare " + std::to_string(id) + R"( \(pid (\d+)\) ready: loaded)");
  const auto deadline = std::chrono::steady_clock::now() + kJobTimeout;
  while (std::chrono::steady_clock::now() < deadline && !job.exited()) {
    std::smatch m;
    const std::string out = job.output();
    if (std::regex_search(out, m, ready)) return static_cast<pid_t>(std::stol(m[1]));
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return -1;
}

}  // namespace

TEST_CASE("two nodes, replace: a worker of node 1 SIGKILLed is replaced by its agent, the other "
          "workers of both nodes keep their processes, weights bit-identical",
          "[recovery][nodes][slow]") {
  if (!haveData()) return skipWithoutData();
  const auto& reference = referenceRun();
  TempDir dir;
  TwoNodes job(dir, {"--max-restarts=1", "--recovery=in-process"});
  const auto [r0, r1, r2, r3] = workersAfterCheckpoint(job, dir);
  REQUIRE(::kill(r2, SIGKILL) == 0);
  REQUIRE(job.showingOutput(waitForOutput(*job.node1, "rank 2 joined generation 1", kJobTimeout)));
  for (pid_t p : {r0, r1, r3}) CHECK(::kill(p, 0) == 0);
  const auto [out0, out1] = job.finish();
  INFO("node 0:\n" << out0 << "\nnode 1:\n" << out1);
  CHECK_THAT(out1, Contains("rank 2 (local rank 0, pid " + std::to_string(r2) + ") failed: "
                            "signal 9 (SIGKILL); recovering in process (generation 1): the other "
                            "workers of every node keep running, a new rank 2 is starting "
                            "(restart 1 of 1 spent)"));
  CHECK_THAT(out0, Contains("generation 1 of the worker group (another node recovered in "
                            "process; this node's workers keep running)"));
  CHECK_THAT(out0 + out1, !Contains("restarting the worker"));
  CHECK_THAT(out0, !Contains("resumed from checkpoint"));
  // The survivors never restarted: the same processes ran to the end.
  CHECK(std::regex_search(out0, std::regex(R"(rank 0 recovered in process in \d+ ms)")));
  CHECK_THAT(out0, Contains("done: "));
  CHECK(bitIdentical(loadWeights(dir / "final.pt"), loadWeights(reference / "final.pt")));
}

TEST_CASE("two nodes, shrink: a worker of node 1 SIGKILLed, the group goes on at three ranks "
          "across both nodes, every sample of each epoch exactly once",
          "[recovery][nodes][shrink][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  TwoNodes job(dir, {"--max-restarts=1", "--recovery=in-process", "--recovery-policy=shrink"},
               {{"DDPRUN_SAMPLE_LOG", dir / "samples"}});
  const auto [r0, r1, r2, r3] = workersAfterCheckpoint(job, dir);
  REQUIRE(::kill(r2, SIGKILL) == 0);
  REQUIRE(job.showingOutput(waitForOutput(
      *job.node1, "as rank 2 of 3 (was rank 3 of 4; the group shrank)", kJobTimeout)));
  for (pid_t p : {r0, r1, r3}) CHECK(::kill(p, 0) == 0);
  const auto [out0, out1] = job.finish();
  INFO("node 0:\n" << out0 << "\nnode 1:\n" << out1);
  CHECK_THAT(out1, Contains("rank 2 (local rank 0, pid " + std::to_string(r2) + ") failed: "
                            "signal 9 (SIGKILL); recovering in process (generation 1): the group "
                            "shrinks from 4 to 3 rank(s), the others of every node keep running "
                            "(restart 1 of 1 spent)"));
  CHECK_THAT(out0, Contains("world size 4 -> 3 (in-process recovery, generation 1)"));
  CHECK_THAT(out0 + out1, !Contains("restarting the worker"));
  CHECK_THAT(out0, Contains("done: "));
  // Node 1's agent renumbered its survivor: its console prefix says rank 2 after the shrink.
  CHECK(std::regex_search(out1, std::regex(R"(\[rank 2\]: \[ddprun W [0-9:.]+ runtime rank 2\] )"
                                           R"(rank 2 recovered in process)")));
  const std::string log = dir / "samples";
  for (int e = 0; e < kEpochs; ++e) {
    checkEpochExactlyOnce(log, e, epochSamples(log, e).lastWorld,
                          {.examples = kExamples, .batch = kBatch, .seed = kSeed});
  }
  CHECK(epochSamples(log, kEpochs - 1).lastWorld == 3);
}

TEST_CASE("two nodes, --spares=1: node 1's waiting spare takes the rank of node 1's dead worker, "
          "weights bit-identical", "[recovery][nodes][spares][slow]") {
  if (!haveData()) return skipWithoutData();
  const auto& reference = referenceRun();
  TempDir dir;
  TwoNodes job(dir, {"--max-restarts=1", "--recovery=in-process", "--spares=1"});
  // Spare ids are unique in the job: n x nodes + node rank, so node 1's first is spare 1.
  REQUIRE(job.showingOutput(waitForOutput(*job.node1, "spare 1 (pid ", kJobTimeout)));
  REQUIRE(job.showingOutput(
      waitForOutput(*job.node1, "ready: loaded, waiting for a rank", kJobTimeout)));
  const pid_t r0 = waitForWorker(*job.node0, 0), r2 = waitForWorker(*job.node1, 2);
  const pid_t r3 = waitForWorker(*job.node1, 3);
  REQUIRE(job.showingOutput(r0 > 0));
  REQUIRE(job.showingOutput(r2 > 0));
  REQUIRE(job.showingOutput(r3 > 0));
  REQUIRE(::kill(r3, SIGKILL) == 0);
  REQUIRE(job.showingOutput(waitForOutput(*job.node1, "rank 3 joined generation 1", kJobTimeout)));
  for (pid_t p : {r0, r2}) CHECK(::kill(p, 0) == 0);
  const auto [out0, out1] = job.finish();
  INFO("node 0:\n" << out0 << "\nnode 1:\n" << out1);
  CHECK(std::regex_search(out1, std::regex(R"(rank 3 \(local rank 1, pid \d+\) failed: signal 9 )"
                                           R"(\(SIGKILL\); recovering in process \(generation 1\): )"
                                           R"(the other workers of every node keep running, spare 1 )"
                                           R"(\(pid \d+\) takes rank 3)")));
  CHECK_THAT(out0 + out1, !Contains("restarting the worker"));
  CHECK(bitIdentical(loadWeights(dir / "final.pt"), loadWeights(reference / "final.pt")));
}

TEST_CASE("two nodes, --spares=1: ready spares SIGKILLed three times in a row on each node are "
          "started again every time (no start-up failure: spares are kept), then a spare takes "
          "a dead worker's rank", "[recovery][nodes][spares][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  // The four workers are held (SIGSTOP) while the spares are killed, so the training cannot end
  // first: a spare started while the template still loads runs at SCHED_IDLE and, beside four
  // busy ranks on two cores, got no CPU until the job was over (CI, and 4 runs of 10 here, with
  // 12 epochs). --peer-timeout=0: a held worker's heartbeat stops, and it must not be killed
  // for it; a stopped process is not dead to its peers' watch (peer_watch_test.cpp).
  TwoNodes job(dir, {"--max-restarts=1", "--recovery=in-process", "--spares=1",
                     "--peer-timeout=0", "--stall-warning=0"});
  Job* nodes[2] = {job.node0.get(), job.node1.get()};
  std::array<pid_t, 4> workers;
  for (int r = 0; r < 4; ++r) {
    workers[r] = waitForWorker(*nodes[r / 2], r);
    INFO("rank " << r);
    REQUIRE(job.showingOutput(workers[r] > 0));
  }
  // Held once each agent has started its spares (it starts them after its workers loaded).
  for (int n = 0; n < 2; ++n) {
    REQUIRE(job.showingOutput(waitForOutput(*nodes[n], "starting spare " + std::to_string(n),
                                            kJobTimeout)));
  }
  struct Held {  // released once: by release(), or on any other way out (a failed REQUIRE)
    std::array<pid_t, 4> pids;
    bool held = true;
    bool release() {  // true when every worker was sent SIGCONT now
      if (!held) return false;
      held = false;
      bool ok = true;
      for (pid_t p : pids) ok = ::kill(p, SIGCONT) == 0 && ok;
      return ok;
    }
    ~Held() { release(); }
  } held{workers};
  for (pid_t p : workers) REQUIRE(::kill(p, SIGSTOP) == 0);
  // Spare ids are n x nodes + node rank: node 0's are 0, 2, 4, 6, node 1's 1, 3, 5, 7. Node 0's
  // agent hosts the workers' store, node 1's reads it over its link; before, both counted every
  // spare death on several nodes as "not ready", so the third ended the node's spares.
  for (int round = 0; round < 3; ++round) {
    for (int n = 0; n < 2; ++n) {
      const int id = 2 * round + n;
      INFO("node " << n << ", spare " << id);
      const pid_t p = waitForReadySpare(*nodes[n], id);
      REQUIRE(job.showingOutput(p > 0));
      REQUIRE(::kill(p, SIGKILL) == 0);
      const std::string died = "spare " + std::to_string(id) + " (pid " + std::to_string(p) +
                               ") died";
      REQUIRE(job.showingOutput(waitForOutput(*nodes[n], died, kJobTimeout)));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the rest of its line
      INFO(nodes[n]->output());
      CHECK_THAT(nodes[n]->output(),
                 Contains(died + " while waiting, after it was ready (signal 9 (SIGKILL)): "
                                 "starting another; the workers are not touched, no restart is "
                                 "spent"));
      CHECK_THAT(nodes[n]->output(), !Contains("no more spares for this group"));
    }
  }
  // Both nodes still keep a spare; node 1's takes its dead worker's rank in process.
  const pid_t spare6 = waitForReadySpare(*job.node0, 6);
  const pid_t spare7 = waitForReadySpare(*job.node1, 7);
  REQUIRE(job.showingOutput(spare6 > 0));
  REQUIRE(job.showingOutput(spare7 > 0));
  // The workers go on; node 1's rank 3 dies, still in its first generation.
  REQUIRE(held.release());
  const pid_t r0 = workers[0], r3 = workers[3];
  REQUIRE(::kill(r3, SIGKILL) == 0);
  REQUIRE(job.showingOutput(waitForOutput(*job.node1, "rank 3 joined generation 1", kJobTimeout)));
  CHECK(::kill(r0, 0) == 0);
  const auto [out0, out1] = job.finish();
  INFO("node 0:\n" << out0 << "\nnode 1:\n" << out1);
  CHECK_THAT(out1, Contains("recovering in process (generation 1): the other workers of every "
                            "node keep running, spare 7 (pid " + std::to_string(spare7) +
                            ") takes rank 3"));
  CHECK_THAT(out0 + out1, !Contains("no more spares for this group"));
  CHECK_THAT(out0 + out1, !Contains("restarting the worker"));
  CHECK_THAT(out0, Contains("done: "));
}

TEST_CASE("two nodes, --spares=1: node 1's spares killed as they start, three in a row before "
          "they were ready, end its spares with one line naming the three deaths, then its dead "
          "worker gets a new process", "[recovery][nodes][spares][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  // Every spare exec'd (DDPRUN_SPARE_TEMPLATE=0): a fork of the template, warmed up already,
  // can be ready within milliseconds of its first line, before the kill below.
  TwoNodes job(dir, {"--max-restarts=1", "--recovery=in-process", "--spares=1"},
               {{"DDPRUN_SPARE_TEMPLATE", "0"}}, /*epochs=*/4);
  // Node 1's spares 1, 3 and 5 killed the moment they appear, long before they load LibTorch:
  // node 1's agent reads their ready keys over its link to node 0's store. Two signals, two
  // causes.
  const int signals[3] = {SIGKILL, SIGTERM, SIGKILL};
  pid_t pids[3] = {-1, -1, -1};
  for (int i = 0; i < 3; ++i) {
    const int id = 2 * i + 1;
    pids[i] = waitForStartingSpare(*job.node1, id, kJobTimeout);
    INFO("spare " << id);
    REQUIRE(job.showingOutput(pids[i] > 0));
    REQUIRE(::kill(pids[i], signals[i]) == 0);
  }
  REQUIRE(job.showingOutput(
      waitForOutput(*job.node1, "the third in a row: no more spares for this group", kJobTimeout)));
  const pid_t r3 = waitForWorker(*job.node1, 3);
  REQUIRE(job.showingOutput(r3 > 0));
  REQUIRE(::kill(r3, SIGKILL) == 0);
  REQUIRE(job.showingOutput(waitForOutput(*job.node1, "rank 3 joined generation 1", kJobTimeout)));
  const auto [out0, out1] = job.finish();
  INFO("node 0:\n" << out0 << "\nnode 1:\n" << out1);
  const std::string p1 = std::to_string(pids[0]), p3 = std::to_string(pids[1]),
                    p5 = std::to_string(pids[2]);
  CHECK_THAT(out1, Contains("spare 1 (pid " + p1 + ") died before it was ready (signal 9 "
                            "(SIGKILL)), 1 in a row (the third ends this group's spares): "
                            "starting another"));
  CHECK_THAT(out1, Contains("spare 3 (pid " + p3 + ") died before it was ready (signal 15 "
                            "(SIGTERM)), 2 in a row"));
  CHECK_THAT(out1, Contains("spare 5 (pid " + p5 + ") died before it was ready (signal 9 "
                            "(SIGKILL)), the third in a row: no more spares for this group (the "
                            "three: spare 1 (pid " + p1 + "): signal 9 (SIGKILL); spare 3 (pid " +
                            p3 + "): signal 15 (SIGTERM); spare 5 (pid " + p5 + "): signal 9 "
                            "(SIGKILL); see their logs in "));
  CHECK_THAT(out1, !Contains("starting spare 7"));
  // No spare left on node 1: its dead worker's rank goes to a new process, in process.
  CHECK(std::regex_search(out1, std::regex(R"(rank 3 \(local rank 1, pid \d+\) failed: signal 9 )"
                                           R"(\(SIGKILL\); recovering in process \(generation 1\): )"
                                           R"(the other workers of every node keep running, a new )"
                                           R"(rank 3 is starting)")));
  // Node 0's spares are its own: its spare 0 waited to the end.
  CHECK_THAT(out0, !Contains("no more spares for this group"));
  CHECK_FALSE(std::regex_search(out0, std::regex(R"(spare \d+ \(pid \d+\) died)")));
  CHECK_THAT(out0 + out1, !Contains("restarting the worker"));
  CHECK_THAT(out0, Contains("done: "));
}

TEST_CASE("two nodes, a worker of each SIGKILLed at once: two generations (numbers from the "
          "store's ADD, written in order), two restarts spent, weights bit-identical",
          "[recovery][nodes][slow]") {
  if (!haveData()) return skipWithoutData();
  const auto& reference = referenceRun();
  TempDir dir;
  TwoNodes job(dir, {"--max-restarts=2", "--recovery=in-process"});
  const auto [r0, r1, r2, r3] = workersAfterCheckpoint(job, dir);
  REQUIRE(::kill(r1, SIGKILL) == 0);
  REQUIRE(::kill(r2, SIGKILL) == 0);
  const auto [out0, out1] = job.finish();
  INFO("node 0:\n" << out0 << "\nnode 1:\n" << out1);
  // The survivors kept their processes: they ran to the end (the job's exit waited for them).
  CHECK(std::regex_search(out0, std::regex(R"(rank 0 recovered in process in \d+ ms)")));
  CHECK(std::regex_search(out1, std::regex(R"(rank 3 recovered in process in \d+ ms)")));
  // One restart each, counted in the rendezvous: the second recovery spent the second.
  const std::string both = out0 + out1;
  CHECK_THAT(both, Contains("(restart 1 of 2 spent)"));
  CHECK_THAT(both, Contains("(restart 2 of 2 spent)"));
  CHECK_THAT(both, Contains("recovering in process (generation 1)"));
  CHECK_THAT(both, Contains("recovering in process (generation 2)"));
  CHECK_THAT(both, !Contains("restarting the worker"));
  CHECK_THAT(out0, !Contains("resumed from checkpoint"));
  CHECK(bitIdentical(loadWeights(dir / "final.pt"), loadWeights(reference / "final.pt")));
}

TEST_CASE("two nodes, --spares=2: each node's first spare stopped before it was ready, a dead "
          "worker's rank goes to its node's second spare, the ready one",
          "[recovery][nodes][spares][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir dir;
  // 8 epochs: spares 2 and 3 load beside 4 ranks, 2 templates and 2 stopped spares on two CPUs
  // (3-4 s on a slow machine), and both kills come after that; at 2 epochs (3.6 s of training)
  // a CI run's job ended before the first kill landed.
  TwoNodes job(dir, {"--max-restarts=2", "--recovery=in-process", "--spares=2"}, {},
               /*epochs=*/8);
  Job* nodes[2] = {job.node0.get(), job.node1.get()};
  // Node n's spares are n and n + 2 (ids k x nodes + node rank), both exec'd with the group (the
  // spare template is not loaded yet). Spares 0 and 1 SIGSTOPped the moment they appear, long
  // before they load (LibTorch: about a CPU-second), so that their ready keys stay unset; spares
  // 2 and 3 load. Node 0's agent hosts the workers' store and reads the keys there, node 1's
  // reads them over its link. Before, both gave the rank to the spare started first, and the
  // recovery waited for the stopped one.
  pid_t stopped[2] = {-1, -1};
  const auto deadline = std::chrono::steady_clock::now() + kJobTimeout;
  while ((stopped[0] <= 0 || stopped[1] <= 0) && std::chrono::steady_clock::now() < deadline &&
         !job.node0->exited() && !job.node1->exited()) {
    for (int n = 0; n < 2; ++n) {
      if (stopped[n] > 0) continue;
      stopped[n] = sparePid(nodes[n]->pid(), n, "mnist_mlp");
      if (stopped[n] > 0) REQUIRE(::kill(stopped[n], SIGSTOP) == 0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(job.showingOutput(stopped[0] > 0));
  REQUIRE(job.showingOutput(stopped[1] > 0));
  pid_t ready[2] = {-1, -1};
  for (int n = 0; n < 2; ++n) {
    ready[n] = waitForReadySpare(*nodes[n], n + 2);
    REQUIRE(job.showingOutput(ready[n] > 0));
    INFO(nodes[n]->output());
    // Stopped before its ready line:
    REQUIRE_THAT(nodes[n]->output(), !Contains("spare " + std::to_string(n) + " (pid " +
                                               std::to_string(stopped[n]) + ") ready"));
  }
  // Node 1's rank 3 first (generation 1), then node 0's rank 1 (generation 2).
  const int deadRank[2] = {1, 3};
  int generation = 0;
  for (int n : {1, 0}) {
    const pid_t dead = waitForWorker(*nodes[n], deadRank[n]);
    REQUIRE(job.showingOutput(dead > 0));
    REQUIRE(::kill(dead, SIGKILL) == 0);
    ++generation;
    const std::string g = std::to_string(generation);
    const bool recovering =
        waitForOutput(*nodes[n], "recovering in process (generation " + g + ")", kJobTimeout);
    // It loads and waits (with the old choice: takes the rank late).
    ::kill(stopped[n], SIGCONT);
    REQUIRE(job.showingOutput(recovering));
    REQUIRE(job.showingOutput(waitForOutput(
        *nodes[n], "rank " + std::to_string(deadRank[n]) + " joined generation " + g,
        kJobTimeout)));
  }
  const auto [out0, out1] = job.finish();
  INFO("node 0:\n" << out0 << "\nnode 1:\n" << out1);
  CHECK_THAT(out1, Contains("recovering in process (generation 1): the other workers of every "
                            "node keep running, spare 3 (pid " + std::to_string(ready[1]) +
                            ") takes rank 3"));
  CHECK_THAT(out0, Contains("recovering in process (generation 2): the other workers of every "
                            "node keep running, spare 2 (pid " + std::to_string(ready[0]) +
                            ") takes rank 1"));
  for (int n = 0; n < 2; ++n) {
    CHECK_THAT(out0 + out1, !Contains("spare " + std::to_string(n) + " (pid " +
                                      std::to_string(stopped[n]) + ") takes rank"));
  }
  CHECK_THAT(out0 + out1, !Contains("restarting the worker"));
  CHECK_THAT(out0, Contains("done: "));
}
