// The worker environment: exactly torchrun's variables, with the right values.
#include <catch2/catch.hpp>

#include "launcher/hot_spares.h"
#include "launcher/worker_env.h"

using namespace ddprun::launcher;

namespace {

// torchrun 1.13's set (local_elastic_agent.py + TORCHELASTIC_ERROR_FILE), plus the newer
// TORCH_NCCL_ASYNC_ERROR_HANDLING.
const std::set<std::string> kTorchrunKeys = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "NCCL_ASYNC_ERROR_HANDLING",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING"};

std::set<std::string> keys(const Environment& env) {
  std::set<std::string> k;
  for (const auto& [name, _] : env) k.insert(name);
  return k;
}

}  // namespace

TEST_CASE("the overlay holds torchrun's variables for 1, 2 and 4 workers", "[launcher][env]") {
  const Environment base{{"PATH", "/usr/bin"}, {"HOME", "/root"}};
  for (int nproc : {1, 2, 4}) {
    RoundInfo round{.round = 3, .restartCount = 2, .nodeRank = 0, .nodeCount = 1,
                    .rankOffset = 0, .worldSize = nproc, .masterAddr = "127.0.0.1",
                    .masterPort = 41234, .useAgentStore = true, .runId = "job42"};
    for (int lr = 0; lr < nproc; ++lr) {
      INFO("nproc " << nproc << " local rank " << lr);
      const std::string errorFile = "/logs/attempt_3/" + std::to_string(lr) + "/error.json";
      Environment env = workerEnvOverlay(WorkerEnvInputs{.base = base, .round = round,
                                                         .localRank = lr,
                                                         .localWorldSize = nproc,
                                                         .maxRestarts = 5, .role = "trainer",
                                                         .errorFile = errorFile});
      std::set<std::string> expected = kTorchrunKeys;
      if (nproc > 1) expected.insert("OMP_NUM_THREADS");
      CHECK(keys(env) == expected);
      CHECK(env["RANK"] == std::to_string(lr));
      CHECK(env["LOCAL_RANK"] == std::to_string(lr));
      CHECK(env["WORLD_SIZE"] == std::to_string(nproc));
      CHECK(env["LOCAL_WORLD_SIZE"] == std::to_string(nproc));
      CHECK(env["GROUP_RANK"] == "0");
      CHECK(env["GROUP_WORLD_SIZE"] == "1");
      CHECK(env["ROLE_NAME"] == "trainer");
      CHECK(env["ROLE_RANK"] == std::to_string(lr));
      CHECK(env["ROLE_WORLD_SIZE"] == std::to_string(nproc));
      CHECK(env["MASTER_ADDR"] == "127.0.0.1");
      CHECK(env["MASTER_PORT"] == "41234");
      CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "2");
      CHECK(env["TORCHELASTIC_MAX_RESTARTS"] == "5");
      CHECK(env["TORCHELASTIC_RUN_ID"] == "job42");
      CHECK(env["TORCHELASTIC_USE_AGENT_STORE"] == "True");
      CHECK(env["TORCHELASTIC_ERROR_FILE"] == errorFile);
      CHECK(env["NCCL_ASYNC_ERROR_HANDLING"] == "1");
      CHECK(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1");
      if (nproc > 1) CHECK(env["OMP_NUM_THREADS"] == "1");
    }
  }
}

TEST_CASE("global ranks are offset by the node's first rank", "[launcher][env]") {
  const Environment base;
  RoundInfo round{.nodeRank = 2, .nodeCount = 3, .rankOffset = 8, .worldSize = 12,
                  .masterAddr = "node0", .masterPort = 1, .useAgentStore = false, .runId = "r"};
  auto env = workerEnvOverlay(WorkerEnvInputs{.base = base, .round = round, .localRank = 3,
                                              .localWorldSize = 4});
  CHECK(env["RANK"] == "11");
  CHECK(env["LOCAL_RANK"] == "3");
  CHECK(env["GROUP_RANK"] == "2");
  CHECK(env["GROUP_WORLD_SIZE"] == "3");
  CHECK(env["WORLD_SIZE"] == "12");
  CHECK(env["TORCHELASTIC_USE_AGENT_STORE"] == "False");
}

TEST_CASE("the user's OMP_NUM_THREADS and NCCL settings are kept", "[launcher][env]") {
  const Environment base{{"OMP_NUM_THREADS", "4"}, {"NCCL_ASYNC_ERROR_HANDLING", "0"},
                         {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"}};
  RoundInfo round{.worldSize = 2};
  auto env = workerEnvOverlay(WorkerEnvInputs{.base = base, .round = round, .localRank = 0,
                                              .localWorldSize = 2});
  CHECK(env["OMP_NUM_THREADS"] == "4");
  CHECK(env["NCCL_ASYNC_ERROR_HANDLING"] == "0");
  CHECK(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3");
  CHECK_FALSE(setsOmpNumThreads(base, 2));
  CHECK(setsOmpNumThreads({}, 2));
  CHECK_FALSE(setsOmpNumThreads({}, 1));
}

TEST_CASE("the worker's environment is the launcher's plus the overlay", "[launcher][env]") {
  const Environment base{{"PATH", "/bin"}, {"RANK", "stale"}, {"FOO", "bar"}};
  auto merged = mergeEnvironment(base, {{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  CHECK(merged == std::vector<std::string>{"FOO=bar", "PATH=/bin", "RANK=1", "WORLD_SIZE=2"});
}

TEST_CASE("a hot spare's environment is a worker's without its rank", "[launcher][env]") {
  // RANK and the others go also when they came from ddprun's own environment.
  const std::vector<std::string> worker{"DDPRUN_GENERATION=2", "DDPRUN_PROGRESS_FILE=/p",
                                        "DDPRUN_PROGRESS_SLOT=1", "DDPRUN_SPARE=9", "LOCAL_RANK=1",
                                        "MASTER_PORT=5", "RANKING=keep", "RANK=1", "ROLE_RANK=1",
                                        "WORLD_SIZE=2"};
  CHECK(spareEnvironment(worker, 3) ==
        std::vector<std::string>{"DDPRUN_PROGRESS_FILE=/p", "MASTER_PORT=5", "RANKING=keep",
                                 "WORLD_SIZE=2", "DDPRUN_SPARE=3"});
}
