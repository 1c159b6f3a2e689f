// The three-node fixture of the lost-node tests (node_loss_test.cpp, moved_rank_test.cpp):
// three real ddprun agents on loopback addresses 127.0.0.2, .3 and .4, the c10d rendezvous on a
// ddprun-store of its own on 127.0.0.1 (heartbeats every 0.3 s), one mnist_mlp rank each, node
// ranks in arrival order (the default rank_order): the fixture reads which agent holds which node
// rank from its worker's RANK. (The store is not an agent's: with arrival ranks the agent that
// would host it may hold node rank 1, and the tests' lost node must not take the rendezvous with
// it.) docs/recovery.md#a-lost-node.
#pragma once

#include "tests/support/catch_torch.h"

#include <signal.h>

#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "fashion_mnist.h"
#include "job_runner.h"
#include "test_files.h"
#include "trained_weights.h"
#include "tests/support/process.h"

namespace ddprun::trainers::testing::three_nodes {

using ddprun::testing::startEnv;  // tests/support/process.h

using Catch::Matchers::Contains;

inline const std::string kBin = DDPRUN_BIN_DIR;
inline constexpr auto kJobTimeout = std::chrono::seconds(240);
inline constexpr int64_t kExamples = 4096;
inline constexpr int64_t kBatch = 16;
inline constexpr int kEpochs = 2;
inline constexpr uint64_t kSeed = 11;
// Fast eviction (0.3 s x 3 missed beats); the store host waits 2 s, not 30, for the lost node
// to learn that the job ended (it never will: it is dead).
inline const std::string kConf =
    "heartbeat=0.3,missed_heartbeats=3,last_call_timeout=20,join_timeout=60,read_timeout=10,"
    "close_timeout=2,exit_barrier_timeout=60";


// The agent on 127.0.0.<2 + node>, meeting the others at the ddprun-store on 127.0.0.1:`port`.
inline std::vector<std::string> agent(int node, int port, const std::string& dir,
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
    REQUIRE(testing::showingOutput(
        waitForOutput(*store, "ddprun-store listening on", std::chrono::seconds(30)), *store));
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
  // `ok`, passed on; when it is false, the three agents' output so far (each named by its
  // address, and its node rank once findRanks() found it) goes into the message of the assertion
  // being evaluated (job_runner.h's showingOutput).
  bool showingOutput(bool ok) const {
    std::string name[3];
    for (int n = 0; n < 3; ++n) {
      name[n] = "the agent on 127.0.0." + std::to_string(2 + n);
      for (int k = 0; k < 3; ++k)
        if (at[k] == node[n].get()) name[n] += " (node rank " + std::to_string(k) + ")";
    }
    return testing::showingOutput(
        ok, {{name[0], node[0].get()}, {name[1], node[1].get()}, {name[2], node[2].get()}});
  }
  // Node rank 1 is lost: its agent first (no report of the worker's death can leave it), then
  // its worker (only processes of this test's own ddprun). Says who held which node rank.
  void loseNodeRank1() {
    std::cout << "node ranks 0, 1, 2: " << addr(0) << ", " << addr(1) << ", " << addr(2)
              << std::endl;
    REQUIRE(::kill(at[1]->pid(), SIGKILL) == 0);
    REQUIRE(::kill(worker[1], SIGKILL) == 0);
  }
  // Every agent's end (bounded), the survivors (node ranks 0 and 2) required to exit 0 (both
  // outputs in the failure's message); returns the survivors' outputs.
  struct End {
    std::string out0, out2;
  };
  End waitForEnd() {
    const int code0 = at[0]->wait(kJobTimeout);
    const int code2 = at[2]->wait(kJobTimeout);
    at[1]->wait(kJobTimeout);
    End e{.out0 = at[0]->output(), .out2 = at[2]->output()};
    INFO("node rank 0:\n" << e.out0 << "\nnode rank 2:\n" << e.out2);
    REQUIRE(code0 == 0);
    REQUIRE(code2 == 0);
    return e;
  }
};

// The uninterrupted three-node run (once per test process).
inline const TempDir& referenceRun() {
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

inline std::string escaped(std::string addr) {
  for (size_t i = addr.find('.'); i != std::string::npos; i = addr.find('.', i + 2))
    addr.insert(i, "\\");
  return addr;
}

// The start of node rank 0's line for node rank 1, at `lostAddr`, evicted and recovered in
// process in generation 1 (a regex; what is done with its ranks follows).
inline std::string lostInProcessRe(const std::string& lostAddr) {
  return R"(node rank 1 was lost: node )" + escaped(lostAddr) +
         R"(-\S+ was evicted: no heartbeat for 900 ms \(lost in process\); recovering in )"
         R"(process \(generation 1\): )";
}

// The first number matched by group 1 of `re` in the agent's output, waited for (bounded); -1
// when the agent exited first.
inline pid_t waitForNumber(Job& agent, const std::string& re) {
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

// The survivors (node ranks 0 and 2) never restarted: the same processes recovered in process
// and ran to the end, no checkpoint was read.
inline void checkSurvivorsKeptRunning(const std::string& out0, const std::string& out2) {
  CHECK_THAT(out0 + out2, !Contains("restarting the worker"));
  CHECK_THAT(out0, !Contains("resumed from checkpoint"));
  CHECK(std::regex_search(out0, std::regex(R"(rank 0 recovered in process in \d+ ms)")));
  CHECK(std::regex_search(out2, std::regex(R"(rank 2 recovered in process in \d+ ms)")));
  CHECK_THAT(out0, Contains("done: "));
}

}  // namespace ddprun::trainers::testing::three_nodes
