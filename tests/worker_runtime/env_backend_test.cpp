// The worker environment (pure parsing with an injected environment) and the backend choice.
#include "tests/support/catch_torch.h"

#include <map>

#include "base/errors.h"
#include "rendezvous/threaded_store_server.h"
#include "tests/support/env_of.h"
#include "worker_runtime/backend.h"
#include "worker_runtime/env.h"
#include "worker_runtime/nccl_communicator.h"
#include "worker_runtime/runtime.h"

using namespace ddprun::runtime;

namespace {

using ddprun::test::envOf;

std::map<std::string, std::string> ddprunEnv() {
  return {{"RANK", "3"},
          {"WORLD_SIZE", "4"},
          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"GROUP_RANK", "1"},
          {"GROUP_WORLD_SIZE", "2"},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29500"},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"},
          {"TORCHELASTIC_RESTART_COUNT", "2"},
          {"TORCHELASTIC_MAX_RESTARTS", "3"},
          {"TORCHELASTIC_RUN_ID", "job-7"}};
}

}  // namespace

TEST_CASE("the worker environment is read as ddprun and torchrun set it", "[env]") {
  const WorkerEnv w = readWorkerEnv(envOf(ddprunEnv()));
  CHECK(w.rank == 3);
  CHECK(w.worldSize == 4);
  CHECK(w.localRank == 1);
  CHECK(w.localWorldSize == 2);
  CHECK(w.groupRank == 1);
  CHECK(w.groupWorldSize == 2);
  CHECK(w.masterAddr == "127.0.0.1");
  CHECK(w.masterPort == 29500);
  CHECK(w.useAgentStore);
  CHECK(w.restartCount == 2);
  CHECK(w.maxRestarts == 3);
  CHECK(w.runId == "job-7");
}

TEST_CASE("optional variables take torchrun's defaults", "[env]") {
  const WorkerEnv w = readWorkerEnv(envOf(
      {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1234"}}));
  CHECK(w.localRank == 1);
  CHECK(w.localWorldSize == 2);
  CHECK_FALSE(w.useAgentStore);
  CHECK(w.restartCount == 0);
}

TEST_CASE("a missing or bad variable names itself and suggests ddprun", "[env]") {
  auto without = [](const std::string& name) {
    auto e = ddprunEnv();
    e.erase(name);
    return envOf(e);
  };
  auto with = [](const std::string& name, const std::string& value) {
    auto e = ddprunEnv();
    e[name] = value;
    return envOf(e);
  };
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    CHECK_THROWS_WITH(readWorkerEnv(without(name)),
                      Catch::Contains(std::string(name) + " is not set") &&
                          Catch::Contains("run it under ddprun"));
  }
  CHECK_THROWS_WITH(readWorkerEnv(with("RANK", "x1")),
                    Catch::Contains("RANK='x1' is not valid") && Catch::Contains("integer"));
  CHECK_THROWS_WITH(readWorkerEnv(with("RANK", "4")), Catch::Contains("RANK=4 is not below WORLD_SIZE=4"));
  CHECK_THROWS_WITH(readWorkerEnv(with("WORLD_SIZE", "0")), Catch::Contains("WORLD_SIZE='0'"));
  CHECK_THROWS_WITH(readWorkerEnv(with("MASTER_PORT", "70000")),
                    Catch::Contains("MASTER_PORT='70000'") && Catch::Contains("1..65535"));
  CHECK_THROWS_WITH(readWorkerEnv(with("LOCAL_RANK", "2")),
                    Catch::Contains("LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"));
  CHECK_THROWS_WITH(readWorkerEnv(with("TORCHELASTIC_USE_AGENT_STORE", "yes")),
                    Catch::Contains("TORCHELASTIC_USE_AGENT_STORE='yes'"));
  CHECK_THROWS_WITH(readWorkerEnv(with("TORCHELASTIC_RESTART_COUNT", "-1")),
                    Catch::Contains("TORCHELASTIC_RESTART_COUNT='-1'"));
  CHECK_THROWS_AS(readWorkerEnv(with("LOCAL_WORLD_SIZE", "8")), ddprun::ConfigError);
}

TEST_CASE("DDPRUN_BACKEND values and the auto choice", "[backend]") {
  CHECK(parseBackend("auto") == Backend::Auto);
  CHECK(parseBackend("GLOO") == Backend::Gloo);
  CHECK(parseBackend("nccl") == Backend::Nccl);
  CHECK_THROWS_WITH(parseBackend("mpi"),
                    Catch::Contains("DDPRUN_BACKEND='mpi'") && Catch::Contains("auto, nccl or gloo"));

  CHECK(chooseBackend(Backend::Auto, true, 2).backend == Backend::Nccl);
  CHECK(chooseBackend(Backend::Auto, true, 0).backend == Backend::Gloo);
  CHECK(chooseBackend(Backend::Auto, true, 0).reason == "auto: NCCL built, but no GPU visible");
  CHECK(chooseBackend(Backend::Auto, false, 4).backend == Backend::Gloo);
  CHECK(chooseBackend(Backend::Gloo, true, 4).backend == Backend::Gloo);
  CHECK_THROWS_WITH(chooseBackend(Backend::Nccl, true, 0), Catch::Contains("no GPU is visible"));
  CHECK_THROWS_WITH(chooseBackend(Backend::Nccl, false, 0), Catch::Contains("built without"));
}

TEST_CASE("on this machine auto picks the backend its GPUs allow and a refused nccl names the reason",
          "[backend]") {
  // No assumption about the machine: what follows from the GPU count found here is checked.
  const int gpus = visibleGpuCount();
  const bool nccl = ncclBuilt() && gpus > 0;
  INFO("visible GPUs: " << gpus << ", NCCL built: " << ncclBuilt());
  auto env = envOf({{"RANK", "0"},
                    {"WORLD_SIZE", "1"},
                    {"MASTER_ADDR", "127.0.0.1"},
                    {"MASTER_PORT", "0"}});
  // MASTER_PORT=0 is invalid: the error names it.
  CHECK_THROWS_WITH(init({.env = env}), Catch::Contains("MASTER_PORT='0'"));
  // A real single-rank job: rank 0 hosts the store on a free port.
  auto free = [] {
    auto probe = std::make_unique<ddprun::rendezvous::ThreadedStoreServer>(
        ddprun::rendezvous::StoreServerOptions{.host = "127.0.0.1", .port = 0});
    return probe->port();
  }();
  std::map<std::string, std::string> vars{{"RANK", "0"},
                                          {"WORLD_SIZE", "1"},
                                          {"MASTER_ADDR", "127.0.0.1"},
                                          {"MASTER_PORT", std::to_string(free)},
                                          {"DDPRUN_BACKEND", "auto"}};
  {
    auto rt = init({.env = envOf(vars)});
    CHECK(rt->comm()->backend() == (nccl ? "nccl" : "gloo"));
    CHECK(rt->device().is_cuda() == nccl);
  }
  vars["DDPRUN_BACKEND"] = "nccl";
  if (nccl) {
    CHECK(init({.env = envOf(vars)})->comm()->backend() == "nccl");
  } else {
    CHECK_THROWS_WITH(init({.env = envOf(vars)}),
                      Catch::Contains("nccl") && Catch::Contains(ncclBuilt() ? "no GPU is visible"
                                                                             : "built without"));
  }
  vars["DDPRUN_BACKEND"] = "mpi";
  CHECK_THROWS_WITH(init({.env = envOf(vars)}), Catch::Contains("DDPRUN_BACKEND='mpi'"));
  vars["DDPRUN_BACKEND"] = "gloo";
  vars["DDPRUN_TIMEOUT"] = "soon";
  CHECK_THROWS_WITH(init({.env = envOf(vars)}), Catch::Contains("DDPRUN_TIMEOUT='soon'"));
}
