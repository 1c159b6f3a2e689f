// A hot spare's warm-up (InitOptions::spareWarmup, docs/recovery.md#warm-up): init() of a spare
// runs the program's callback before it tells the agent it is ready, on a communicator of its
// own that DDP can be built on, without opening the progress writer (the spare has no record
// yet: opened then, it would count in rank 0's); init() of a rank never runs it. Two ranks as threads of this process on a real ddprun
// store over TCP (the agent's store): rank 0 a survivor of generation 0, the spare takes rank 1
// in generation 1, and both then train one DDP step together.
#include "tests/support/catch_torch.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fcntl.h>
#include <map>
#include <thread>

#include "base/progress_file.h"
#include "rendezvous/prefix_store.h"
#include "rendezvous/recovery_keys.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/threaded_store_server.h"
#include "tests/support/env_of.h"
#include "tests/support/temp_dir.h"
#include "worker_runtime/ddp.h"
#include "worker_runtime/runtime.h"

using namespace ddprun;
using namespace ddprun::runtime;

namespace {

using ddprun::test::envOf;

// One synchronised DDP step of a small model on `comm`: what reports progress.
void ddpStep(const std::shared_ptr<Communicator>& comm, int seed) {
  torch::manual_seed(seed);
  auto model = std::make_shared<torch::nn::LinearImpl>(8, 4);
  DistributedDataParallel ddp(model, comm);
  model->forward(torch::ones({2, 8})).sum().backward();
}

std::optional<progress::ProgressSample> record(const std::string& path, int slot) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  auto s = progress::readProgressRecord(fd, slot);
  ::close(fd);
  return s;
}

}  // namespace

TEST_CASE("spare warm-up: a spare runs the program's warm-up before it is ready, on a "
          "communicator of its own, without reporting progress, and a rank never runs it",
          "[spare][warmup]") {
  namespace keys = rendezvous::recovery;
  rendezvous::ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  testing::TempDir dir;
  // The agent's progress table: the spare must end up reporting in record 1, its local rank's,
  // and nothing may land in record 0 (rank 0's), where an unset DDPRUN_PROGRESS_SLOT points.
  const std::string table = dir.path() + "/progress";
  progress::writeProgressTable(table, 2);
  ::setenv(progress::kProgressFileEnv, table.c_str(), 1);
  ::unsetenv(progress::kProgressSlotEnv);
  const std::map<std::string, std::string> job{
      {"WORLD_SIZE", "2"},       {"LOCAL_WORLD_SIZE", "2"},
      {"GROUP_RANK", "0"},       {"GROUP_WORLD_SIZE", "1"},
      {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(server.port())},
      {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_RESTART_COUNT", "0"},
      {"TORCHELASTIC_RUN_ID", "warmup-test"},   {"DDPRUN_TIMEOUT", "30"}};
  rendezvous::PrefixStore agent(keys::attemptPrefix(0),
                                std::make_shared<rendezvous::TcpStore>(rendezvous::TcpStoreOptions{
                                    .host = "127.0.0.1",
                                    .port = server.port(),
                                    .timeout = std::chrono::seconds(30)}));

  std::atomic<int> spareWarmups{0}, rankWarmups{0};
  std::atomic<bool> readyDuringWarmup{false}, writerOpenDuringWarmup{false};
  std::atomic<int> warmupCommSize{-1};
  std::string spareError;
  std::atomic<bool> spareDone{false};
  std::unique_ptr<Runtime> spareRt;
  std::thread spare([&] {
    auto vars = job;
    vars["DDPRUN_SPARE"] = "0";
    try {
      spareRt = init({.env = envOf(vars), .spareWarmup = [&](const std::shared_ptr<Communicator>& comm) {
                        ++spareWarmups;
                        readyDuringWarmup = agent.check({keys::spareReadyKey(0)});
                        warmupCommSize = comm->size();
                        ddpStep(comm, 1);  // DDP's backward reports a step: held here
                        writerOpenDuringWarmup = progress::ProgressWriter::instance().active();
                      }});
    } catch (const std::exception& e) {
      spareError = e.what();
    }
    spareDone = true;
  });
  // The agent: the spare says it is ready (after its warm-up); a death of rank 1 makes
  // generation 1, in which the spare takes rank 1 and rank 0 stays.
  for (int i = 0; i < 600 && !agent.check({keys::spareReadyKey(0)}) && !spareDone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!agent.check({keys::spareReadyKey(0)})) {
    spare.join();
    FAIL("the spare never said it was ready: " << spareError);
  }
  CHECK(spareWarmups == 1);
  // Without the hold, the warm-up's DDP step would have opened the writer on record 0 (no
  // DDPRUN_PROGRESS_SLOT yet) and counted its step there, in rank 0's record, for good.
  const auto slot0 = record(table, 0);
  REQUIRE(slot0);
  CHECK(slot0->steps == 0);
  agent.set(keys::generationKey(1),
            keys::formatGenerationRecord({.generation = 1, .replaced = {1}, .cause = "test", .spare = 0}));
  agent.set(keys::spareAssignKey(0),
            keys::formatSpareAssignment({.generation = 1, .rank = 1, .localRank = 1}));
  std::unique_ptr<Runtime> rank0;
  std::string rankError;
  std::thread r0([&] {
    auto vars = job;
    vars["RANK"] = "0";
    vars["LOCAL_RANK"] = "0";
    vars["DDPRUN_GENERATION"] = "1";
    try {
      rank0 = init({.env = envOf(vars),
                    .spareWarmup = [&](const std::shared_ptr<Communicator>&) { ++rankWarmups; }});
    } catch (const std::exception& e) {
      rankError = e.what();
    }
  });
  spare.join();
  r0.join();
  REQUIRE(spareError.empty());
  REQUIRE(rankError.empty());
  CHECK(spareWarmups == 1);
  CHECK(rankWarmups == 0);
  CHECK_FALSE(readyDuringWarmup);
  CHECK(warmupCommSize == 1);
  CHECK_FALSE(writerOpenDuringWarmup);
  CHECK(spareRt->rank() == 1);
  CHECK(spareRt->generation() == 1);
  // The spare, as rank 1, trains with rank 0 on generation 1's communicator.
  std::thread t0([&] { ddpStep(rank0->comm(), 2); });
  ddpStep(spareRt->comm(), 2);
  t0.join();
  spareRt.reset();
  rank0.reset();
  for (const char* v : {"RANK", "LOCAL_RANK", "ROLE_RANK", "DDPRUN_PROGRESS_SLOT",
                        "DDPRUN_GENERATION", progress::kProgressFileEnv}) {
    ::unsetenv(v);
  }
}
