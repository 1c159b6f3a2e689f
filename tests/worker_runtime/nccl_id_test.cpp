// NCCL's unique-id exchange through a real ddprun store over TCP. ncclGetUniqueId needs no GPU,
// so when ddprun is built with NCCL the id is a real one (the calling process stays alive while
// the others fetch it, as NCCL requires).
#include "tests/support/catch_torch.h"

#include <filesystem>
#include <fstream>

#include "base/errors.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/threaded_store_server.h"
#include "tests/support/temp_dir.h"
#include "tests/worker_runtime/rank_threads.h"
#include "worker_runtime/nccl_communicator.h"

using namespace ddprun::runtime;
using namespace ddprun::rendezvous;

TEST_CASE("every rank receives rank 0's NCCL unique id through the store", "[nccl]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const int P = 4;
  std::vector<std::string> ids(P);
  const bool real = ncclBuilt();
  test::runRanks(P, [&](int r) {
    TcpStore store({.host = "127.0.0.1", .port = server.port(), .timeout = std::chrono::seconds(10)});
    auto generate = [&] {
      return real ? generateNcclUniqueId() : std::string(128, '\x5a');
    };
    ids[r] = exchangeUniqueId(store, "nccl/0/unique_id", r, generate, std::chrono::seconds(10));
  });
  for (int r = 0; r < P; ++r) {
    CHECK(ids[r].size() == 128);
    CHECK(ids[r] == ids[0]);
  }
  if (real) {
    CHECK(ids[0] != std::string(128, '\0'));  // NCCL filled it in
    CHECK(generateNcclUniqueId() != ids[0]);  // and each call gives a new one
  }
}

TEST_CASE("a wrong-size id and a missing rank 0 are errors, not hangs", "[nccl]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  TcpStore store({.host = "127.0.0.1", .port = server.port(), .timeout = std::chrono::seconds(5)});
  store.set("bad", "short");
  CHECK_THROWS_WITH(exchangeUniqueId(store, "bad", 1, nullptr, std::chrono::seconds(1)),
                    Catch::Contains("has 5 bytes, expected 128"));
  CHECK_THROWS_AS(exchangeUniqueId(store, "never", 1, nullptr, std::chrono::milliseconds(300)),
                  ddprun::TimeoutError);
}

TEST_CASE("the GPU count asks CUDA only where an NVIDIA driver's module or device node is",
          "[nccl]") {
  // A machine root made here: nothing of a driver, then each of the three signs alone.
  ddprun::testing::TempDir root;
  CHECK_FALSE(nvidiaDriverPresent(root.path()));
  for (const std::string sign : {"proc/driver/nvidia", "dev/nvidiactl", "dev/dxg"}) {
    INFO(sign);
    ddprun::testing::TempDir machine;
    const auto path = std::filesystem::path(machine.path()) / sign;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path.string()) << "";
    CHECK(nvidiaDriverPresent(machine.path()));
    std::filesystem::remove(path);
    CHECK_FALSE(nvidiaDriverPresent(machine.path()));
  }
  // This machine: no driver, no GPU counted (whatever CUDA toolkit it has).
  if (!nvidiaDriverPresent()) CHECK(visibleGpuCount() == 0);
}

TEST_CASE("the NCCL communicator follows the GPU count: refused with the reason without a GPU",
          "[nccl]") {
  if (!ncclBuilt()) {
    CHECK_THROWS_WITH(generateNcclUniqueId(), Catch::Contains("built without NCCL"));
    return;
  }
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  auto store = std::make_shared<TcpStore>(
      TcpStoreOptions{.host = "127.0.0.1", .port = server.port(), .timeout = std::chrono::seconds(5)});
  if (visibleGpuCount() == 0) {
    CHECK_THROWS_WITH(makeNcclCommunicator(store, {.rank = 0, .size = 1}),
                      Catch::Contains("no GPU") || Catch::Contains("CUDA"));
    CHECK_THROWS_AS(makeNcclCommunicator(store, {.rank = 0, .size = 1}), ddprun::BackendError);
  } else {
    // A GPU host: a one-rank communicator on device 0 is built and reduces on the GPU.
    auto comm = makeNcclCommunicator(store, {.rank = 0, .size = 1});
    CHECK(comm->backend() == "nccl");
    auto t = torch::ones({4}, torch::Device(torch::kCUDA, 0));
    comm->allreduce(t);
    CHECK(t.cpu().equal(torch::ones({4})));
  }
}
