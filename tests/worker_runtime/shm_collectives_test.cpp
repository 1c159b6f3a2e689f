// The shared-memory communicator (worker_runtime/shm) with 2, 3 and 4 ranks as threads of this
// process on one MemoryStore: every collective against a single-process reference, with tiny
// slots so that every size goes through many chunks and slices of uneven length; the segment's
// name leaves /dev/shm once mapped; a rank that never comes makes the others time out, and one
// that fails makes the others fail at once. The multi-process cases (real ranks under ddprun, a
// rank SIGKILLed or SIGSTOPped) are in CMakeLists.txt and peer_loss_test.cpp.
#include "tests/support/catch_torch.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <optional>
#include <vector>

#include "base/errors.h"
#include "rendezvous/memory_store.h"
#include "rendezvous/prefix_store.h"
#include "tests/worker_runtime/caller_thread.h"
#include "tests/worker_runtime/rank_threads.h"
#include "worker_runtime/shm/segment.h"
#include "worker_runtime/shm/shm_communicator.h"
#include "worker_runtime/shm/transport.h"
#include "worker_runtime/hierarchical_communicator.h"
#include "worker_runtime/reduce.h"
#include "tests/worker_runtime/shm_names.h"

using namespace ddprun::runtime;
using ddprun::rendezvous::MemoryStore;
using test::runRanks;
using test::shmLeftovers;
using test::uniqueShmPrefix;

namespace {

const std::vector<torch::Dtype> kDtypes = {torch::kFloat32, torch::kFloat64, torch::kFloat16,
                                           torch::kBFloat16, torch::kInt32,  torch::kInt64,
                                           torch::kInt8,     torch::kUInt8};

torch::Tensor inputFor(int rank, int64_t n, torch::Dtype dtype) {
  auto gen = at::detail::createCPUGenerator(1234 + rank);
  auto t = torch::randint(0, 7, {n}, gen, torch::kInt64);
  if (dtype != torch::kUInt8) t = t - 3;
  if (c10::isFloatingType(dtype)) t = t.to(torch::kFloat64) / 4;  // exact in every float type
  return t.to(dtype);
}

// Reduced in rank order in the input dtype (float16 / bfloat16 through float, as the kernels do).
torch::Tensor reference(int P, int64_t n, torch::Dtype dtype, ReduceOp op) {
  const bool low = dtype == torch::kFloat16 || dtype == torch::kBFloat16;
  auto as = [&](torch::Tensor t) { return low ? t.to(torch::kFloat32) : t; };
  torch::Tensor acc = inputFor(0, n, dtype);
  for (int r = 1; r < P; ++r) {
    auto x = inputFor(r, n, dtype);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: acc = (as(acc) + as(x)).to(dtype); break;
      case ReduceOp::Min: acc = torch::minimum(acc, x); break;
      case ReduceOp::Max: acc = torch::maximum(acc, x); break;
    }
  }
  if (op == ReduceOp::Avg) acc = (as(acc) / P).to(dtype);
  return acc;
}



std::vector<std::shared_ptr<Communicator>> makeGroup(int P, shm::ShmOptions base) {
  auto store = std::make_shared<MemoryStore>(std::chrono::seconds(20));
  std::vector<std::shared_ptr<Communicator>> comms(P);
  runRanks(P, [&](int r) {
    shm::ShmOptions o = base;
    o.rank = r;
    o.size = P;
    if (o.timeout == kDefaultCollectiveTimeout) o.timeout = std::chrono::seconds(20);
    comms[r] = shm::makeShmCommunicator(store, o);
  });
  return comms;
}

}  // namespace

TEST_CASE("streamCopy copies every byte, at any alignment, below, at and above its threshold "
          "and leaves the bytes around the destination alone", "[shm]") {
  const size_t kMax = 200 << 10;
  std::vector<unsigned char> src(kMax + 128), dst(kMax + 256);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{63}, size_t{4097}, (size_t{32} << 10) - 1,
                       size_t{32} << 10, (size_t{32} << 10) + 1, size_t{100003}, kMax}) {
    for (size_t srcOff : {0, 1, 17, 64}) {
      for (size_t dstOff : {64, 65, 100, 127}) {
        std::fill(dst.begin(), dst.end(), 0xAB);
        streamCopy(dst.data() + dstOff, src.data() + srcOff, bytes);
        INFO("bytes " << bytes << " src +" << srcOff << " dst +" << dstOff);
        REQUIRE(std::memcmp(dst.data() + dstOff, src.data() + srcOff, bytes) == 0);
        for (size_t i = 0; i < dstOff; ++i) REQUIRE(dst[i] == 0xAB);
        for (size_t i = dstOff + bytes; i < dst.size(); ++i) REQUIRE(dst[i] == 0xAB);
      }
    }
  }
}

TEST_CASE("shm allreduce equals the reference bit for bit on every rank for every dtype op "
          "size and chunking", "[shm]") {
  const std::string prefix = uniqueShmPrefix("test");
  for (int P : {2, 3, 4}) {
    // 4 KiB slots: every size above goes through many chunks; 1 MiB: 4x the default, and once
    // more with streamed stores from the smallest message on (by default only messages of 8 MiB and
    // more stream, larger than any here).
    struct Config {
      size_t slot;
      size_t streamMinBytes;
    };
    for (const Config& config : {Config{4096, 8u << 20}, Config{1u << 20, 8u << 20},
                                 Config{1u << 20, 0}}) {
      const size_t slot = config.slot;
      const bool streamed = config.streamMinBytes == 0;
      auto comms = makeGroup(P, {.slotBytes = slot, .directMaxBytes = 1024,
                                 .streamMinBytes = config.streamMinBytes, .namePrefix = prefix});
      CHECK(shmLeftovers(prefix) == 0);  // unlinked once every rank mapped it
      for (auto dtype : kDtypes) {
        for (int64_t n : {0, 1, 2, 7, 1001, 65537, 300001}) {
          for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max}) {
            if (op == ReduceOp::Avg && !c10::isFloatingType(dtype)) continue;
            // Time budget: the larger sizes only with Sum on the extra configurations, and the
            // streamed one with float32 and float16 only.
            if (n > 1001 && (slot == 4096 || streamed) && op != ReduceOp::Sum) continue;
            if (streamed && dtype != torch::kFloat32 && dtype != torch::kFloat16) continue;
            const torch::Tensor expected = reference(P, n, dtype, op);
            std::vector<torch::Tensor> out(P);
            runRanks(P, [&](int r) {
              out[r] = inputFor(r, n, dtype);
              comms[r]->allreduce(out[r], op);
            });
            INFO("P=" << P << " slot=" << slot << " streamed=" << streamed << " dtype=" << dtype
                      << " n=" << n
                      << " op=" << toString(op));
            for (int r = 0; r < P; ++r) {
              CHECK(torch::equal(out[r], out[0]));  // the same bits everywhere
              if (op == ReduceOp::Avg) {  // torch may divide differently in the last bit
                CHECK(torch::allclose(out[r].to(torch::kFloat64), expected.to(torch::kFloat64),
                                      1e-2, 1e-2));
              } else {
                CHECK(torch::equal(out[r], expected));
              }
            }
          }
        }
      }
    }
  }
  CHECK(shmLeftovers(prefix) == 0);
}

TEST_CASE("shm allreduce in lent memory is reduced in place, with the reference's bits on every "
          "rank, and tensors elsewhere or at other offsets are copied through the segment", "[shm]") {
  const std::string prefix = uniqueShmPrefix("test");
  for (int P : {2, 3, 4}) {
    auto comms = makeGroup(P, {.slotBytes = 4096, .directMaxBytes = 1024, .namePrefix = prefix});
    std::vector<torch::Tensor> lent(P);
    runRanks(P, [&](int r) { lent[r] = comms[r]->lendSharedBuffer(1 << 20); });
    CHECK(shmLeftovers(prefix) == 0);  // the lent memory's name is gone too
    for (int r = 0; r < P; ++r) {
      REQUIRE(lent[r].defined());
      CHECK(lent[r].dtype() == torch::kUInt8);
      CHECK(lent[r].numel() >= (1 << 20));
    }
    // Where rank r puts its tensor: 0 everywhere (lent, same place), different places, or lent
    // on rank 0 only.
    enum class Where { Same, Shifted, RankZeroOnly };
    for (auto where : {Where::Same, Where::Shifted, Where::RankZeroOnly}) {
      for (auto dtype : kDtypes) {
        for (int64_t n : {1, 7, 1001, 65537}) {
          for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max}) {
            if (op == ReduceOp::Avg && !c10::isFloatingType(dtype)) continue;
            if (where != Where::Same && (op != ReduceOp::Sum || n != 65537)) continue;
            const int64_t bytes = n * static_cast<int64_t>(c10::elementSize(dtype));
            const torch::Tensor expected = reference(P, n, dtype, op);
            std::vector<torch::Tensor> out(P);
            std::vector<AllreduceBytes> before(P), after(P);
            runRanks(P, [&](int r) {
              before[r] = comms[r]->allreduceBytes();
              const int64_t offset = where == Where::Shifted ? 4096 * r : 4096;
              if (where == Where::RankZeroOnly && r != 0) {
                out[r] = inputFor(r, n, dtype);
              } else {
                out[r] = lent[r].narrow(0, offset, bytes).view(dtype);
                out[r].copy_(inputFor(r, n, dtype));
              }
              if (n == 65537) {
                comms[r]->allreduceAsync(out[r], op)->wait();  // as DDP's buckets
              } else {
                comms[r]->allreduce(out[r], op);
              }
              after[r] = comms[r]->allreduceBytes();
            });
            INFO("P=" << P << " where=" << static_cast<int>(where) << " dtype=" << dtype
                      << " n=" << n << " op=" << toString(op));
            for (int r = 0; r < P; ++r) {
              CHECK(torch::equal(out[r], out[0]));
              if (op == ReduceOp::Avg) {
                CHECK(torch::allclose(out[r].to(torch::kFloat64), expected.to(torch::kFloat64),
                                      1e-2, 1e-2));
              } else {
                CHECK(torch::equal(out[r], expected));
              }
              const bool inPlace = where == Where::Same && bytes > 1024;
              CHECK(after[r].inPlace - before[r].inPlace == (inPlace ? uint64_t(bytes) : 0));
              CHECK(after[r].staged - before[r].staged == (inPlace ? 0 : uint64_t(bytes)));
            }
          }
        }
      }
    }
    // The memory belongs to the tensors: it outlives the communicators.
    runRanks(P, [&](int r) { lent[r].narrow(0, 0, 8).fill_(static_cast<uint8_t>(r + 1)); });
    comms.clear();
    for (int r = 0; r < P; ++r) {
      CHECK(torch::equal(lent[r].narrow(0, 0, 8),
                         torch::full({8}, r + 1, torch::TensorOptions().dtype(torch::kUInt8))));
    }
  }
  CHECK(shmLeftovers(prefix) == 0);
}

TEST_CASE("shm broadcast from every root and allgather and barrier and async allreduces in order",
          "[shm]") {
  for (int P : {2, 3, 4}) {
    auto comms = makeGroup(P, {.slotBytes = 4096});
    for (int64_t n : {0, 1, 1001, 3 * 1024 + 5, 100003}) {
      for (int root = 0; root < P; ++root) {
        std::vector<torch::Tensor> out(P);
        runRanks(P, [&](int r) {
          out[r] = inputFor(r, n, torch::kFloat64);
          comms[r]->broadcast(out[r], root);
        });
        INFO("P=" << P << " n=" << n << " root=" << root);
        for (int r = 0; r < P; ++r) CHECK(torch::equal(out[r], inputFor(root, n, torch::kFloat64)));
      }
      std::vector<torch::Tensor> all(P);
      runRanks(P, [&](int r) {
        all[r] = comms[r]->allgather(inputFor(r, n, torch::kInt8).reshape({-1, 1}));
        comms[r]->barrier();
      });
      for (int r = 0; r < P; ++r) {
        REQUIRE(all[r].sizes() == torch::IntArrayRef({P, n, 1}));
        for (int j = 0; j < P; ++j) CHECK(torch::equal(all[r][j].reshape(-1), inputFor(j, n, torch::kInt8)));
      }
    }
    // Several async allreduces in flight, waited in reverse: each has its own result.
    std::vector<std::vector<torch::Tensor>> ts(P);
    runRanks(P, [&](int r) {
      std::vector<std::shared_ptr<Work>> works;
      for (int k = 0; k < 5; ++k) {
        ts[r].push_back(inputFor(r, 5000 + k, torch::kFloat32));
        works.push_back(comms[r]->allreduceAsync(ts[r].back(), ReduceOp::Max));
      }
      for (int k = 4; k >= 0; --k) works[k]->wait();
    });
    for (int r = 0; r < P; ++r) {
      for (int k = 0; k < 5; ++k) {
        CHECK(torch::equal(ts[r][k], reference(P, 5000 + k, torch::kFloat32, ReduceOp::Max)));
      }
    }
  }
}

TEST_CASE("shm blocking collectives run on the caller's thread after the async ones queued "
          "before them", "[shm]") {
  for (int P : {2, 3}) {
    INFO("P=" << P);
    const auto errors = test::checkCallerThread(makeGroup(P, {}));
    for (const auto& e : errors) FAIL_CHECK(e);
    CHECK(errors.empty());
  }
}

TEST_CASE("shm: a rank that never comes times out the others and a failed rank fails them at "
          "once and a broken communicator refuses", "[shm]") {
  auto comms = makeGroup(3, {.timeout = std::chrono::milliseconds(500)});
  std::vector<std::string> errors(3);
  // Rank 2 never calls: ranks 0 and 1 time out (rank 2 is alive: only the deadline ends it).
  runRanks(2, [&](int r) {
    auto t = torch::ones({100000});
    try {
      comms[r]->allreduce(t);
    } catch (const ddprun::TimeoutError& e) {
      errors[r] = std::string("timeout: ") + e.what();
    } catch (const std::exception& e) {
      errors[r] = std::string("other: ") + e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    INFO(errors[r]);
    CHECK_THAT(errors[r], Catch::StartsWith("timeout: ") && Catch::Contains("shm allreduce") &&
                              Catch::Contains("local rank 2"));
  }
  // Now rank 2 comes: ranks 0 and 1 gave up (aborted), so it fails at once, not after 500 ms of
  // waiting for phases that will never come... and names why.
  auto t = torch::ones({100000});
  CHECK_THROWS_AS(comms[2]->allreduce(t), ddprun::BackendError);
  CHECK_THROWS_WITH(comms[0]->allreduce(t), Catch::Contains("refused") && Catch::Contains("broken"));
  CHECK_THROWS_WITH(comms[0]->barrier(), Catch::Contains("refused"));
}

TEST_CASE("shm: bad options and tensors are refused with a clear message", "[shm]") {
  auto store = std::make_shared<MemoryStore>(std::chrono::seconds(5));
  auto make = [&](shm::ShmOptions o) { return shm::makeShmCommunicator(store, o); };
  shm::ShmOptions outside{.rank = 2, .size = 2};
  CHECK_THROWS_WITH(make(outside), Catch::Contains("rank 2 is outside 0..1"));
  shm::ShmOptions tiny{.rank = 0, .size = 1, .slotBytes = 100};
  CHECK_THROWS_WITH(make(tiny), Catch::Contains("too small"));
  shm::ShmOptions slash{.rank = 0, .size = 1, .namePrefix = "a/b"};
  CHECK_THROWS_WITH(make(slash), Catch::Contains("'a/b' is not valid"));
  auto comm = make(shm::ShmOptions{.rank = 0, .size = 1});
  CHECK(comm->backend() == "shm");
  CHECK_THROWS_WITH(comm->allreduce(torch::ones({3}, torch::kInt32), ReduceOp::Avg),
                    Catch::Contains("avg needs a floating dtype"));
  CHECK_THROWS_WITH(comm->allreduce(torch::ones({3}, torch::kBool)),
                    Catch::Contains("dtype Bool is not supported"));
  CHECK_THROWS_WITH(comm->broadcast(torch::ones({3}), 1), Catch::Contains("root 1 is not a rank"));
  auto t = torch::arange(10, torch::kFloat32);
  comm->allreduce(t, ReduceOp::Avg);  // one rank: unchanged
  CHECK(torch::equal(t, torch::arange(10, torch::kFloat32)));
}

TEST_CASE("transport choice: DDPRUN_TRANSPORT parsing and the auto rule", "[shm][backend]") {
  CHECK(shm::parseTransport("SHM") == shm::Transport::Shm);
  CHECK(shm::parseTransport("tcp") == shm::Transport::Tcp);
  CHECK(shm::parseTransport("auto") == shm::Transport::Auto);
  CHECK_THROWS_WITH(shm::parseTransport("rdma"), Catch::Contains("DDPRUN_TRANSPORT='rdma'") &&
                                                Catch::Contains("auto, shm or tcp"));
  int asked = 0;
  auto yes = [&] { ++asked; return true; };
  auto no = [&] { ++asked; return false; };
  using shm::Transport;
  CHECK(shm::chooseTransport(Transport::Auto, 4, 4, 1, yes).transport == Transport::Shm);
  CHECK(shm::chooseTransport(Transport::Auto, 4, 4, 1, no).transport == Transport::Tcp);
  // Two nodes of two: hierarchical, when each node's ranks are on one host.
  const shm::TransportChoice across = shm::chooseTransport(Transport::Auto, 4, 2, 2, yes);
  CHECK(across.transport == Transport::Shm);
  CHECK(across.acrossNodes);
  CHECK_THAT(across.reason, Catch::Contains("2 nodes of 2 ranks") && Catch::Contains("hierarchical"));
  CHECK(shm::chooseTransport(Transport::Auto, 4, 2, 2, no).transport == Transport::Tcp);
  // Not asked: one rank per node, a placement that is not equal nodes, a single rank, tcp.
  CHECK(shm::chooseTransport(Transport::Auto, 4, 1, 4, yes).transport == Transport::Tcp);
  CHECK(shm::chooseTransport(Transport::Auto, 4, 2, 1, yes).transport == Transport::Tcp);
  CHECK(shm::chooseTransport(Transport::Auto, 1, 1, 1, yes).transport == Transport::Tcp);
  CHECK(shm::chooseTransport(Transport::Tcp, 4, 4, 1, yes).transport == Transport::Tcp);
  // Forced.
  const shm::TransportChoice one = shm::chooseTransport(Transport::Shm, 4, 4, 1, yes);
  CHECK((one.transport == Transport::Shm && !one.acrossNodes));
  CHECK(shm::chooseTransport(Transport::Shm, 4, 2, 2, yes).acrossNodes);
  CHECK_THROWS_WITH(shm::chooseTransport(Transport::Shm, 4, 2, 2, no),
                    Catch::Contains("ranks of a node (GROUP_RANK) run on different hosts"));
  CHECK_THROWS_WITH(shm::chooseTransport(Transport::Shm, 4, 3, 2, yes),
                    Catch::Contains("not one of equal nodes") &&
                        Catch::Contains("LOCAL_WORLD_SIZE=3, GROUP_WORLD_SIZE=2, WORLD_SIZE=4"));
  CHECK_THROWS_WITH(shm::chooseTransport(Transport::Shm, 4, 4, 1, no),
                    Catch::Contains("different hosts"));
  CHECK(asked == 8);  // the store is asked only when the placement allows shm
}

TEST_CASE("node check through the store: ranks of each node on one host with local ranks "
          "0..L-1 and nodes 0..N-1", "[shm][hierarchical]") {
  // {node, local rank} of ranks 0..3, each with local size 2.
  auto ask = [](std::vector<std::pair<int, int>> placement) {
    auto store = std::make_shared<MemoryStore>(std::chrono::seconds(20));
    const int P = static_cast<int>(placement.size());
    std::vector<int> answers(P);
    runRanks(P, [&](int r) {
      answers[r] = shm::nodesOnOneHost(*store, {.rank = r,
                                                .size = P,
                                                .node = placement[r].first,
                                                .localRank = placement[r].second,
                                                .localSize = 2});
    });
    for (int a : answers) CHECK(a == answers[0]);  // everyone gets the same answer
    return answers[0] == 1;
  };
  CHECK(ask({{0, 0}, {0, 1}, {1, 0}, {1, 1}}));
  CHECK(ask({{1, 1}, {0, 0}, {1, 0}, {0, 1}}));  // any rank order
  CHECK_FALSE(ask({{0, 0}, {0, 0}, {1, 0}, {1, 1}}));  // local rank 0 twice, 1 missing
  CHECK_FALSE(ask({{0, 0}, {0, 1}, {2, 0}, {2, 1}}));  // nodes 0 and 2
}

TEST_CASE("node check once per attempt: a later generation's survivors reuse their answer and "
          "its replacement reads it, so nobody asks through the generation's store",
          "[shm][recovery]") {
  auto member = [](int r, int P) {
    return shm::NodeMember{.rank = r, .size = P, .node = 0, .localRank = r, .localSize = P};
  };
  // Generation 0: the attempt's store is the generation's; every rank asks and keeps the answer.
  auto attempt = std::make_shared<MemoryStore>(std::chrono::seconds(20));
  std::vector<std::optional<bool>> known(3);
  runRanks(3, [&](int r) {
    CHECK(shm::nodesOnOneHostOnce(*attempt, *attempt, member(r, 3), false, known[r]));
  });
  for (const auto& k : known) CHECK(k == std::optional<bool>(true));
  CHECK(attempt->get("shm/host/answer") == "1");
  // Generation 1: ranks 0 and 2 survived, rank 1 is a new process. Had anyone asked, it would
  // wait for the others' keys in this store and time out.
  auto gen1 = std::make_shared<MemoryStore>(std::chrono::milliseconds(300));
  known[1].reset();
  runRanks(3, [&](int r) {
    CHECK(shm::nodesOnOneHostOnce(*gen1, *attempt, member(r, 3), true, known[r]));
  });
  CHECK(gen1->numKeys() == 0);
  CHECK(known[1] == std::optional<bool>(true));
  // The answer is what was written, not asked again: a "no" stays a "no" for a newcomer.
  attempt->set("shm/host/answer", "0");
  std::optional<bool> fresh;
  CHECK_FALSE(shm::nodesOnOneHostOnce(*gen1, *attempt, member(1, 3), true, fresh));
  CHECK(fresh == std::optional<bool>(false));
  // A later generation in which nobody knows yet (no answer in the attempt's store): all ask.
  auto attempt2 = std::make_shared<MemoryStore>(std::chrono::seconds(20));
  auto gen2 = std::make_shared<MemoryStore>(std::chrono::seconds(20));
  std::vector<std::optional<bool>> none(2);
  runRanks(2, [&](int r) {
    CHECK(shm::nodesOnOneHostOnce(*gen2, *attempt2, member(r, 2), true, none[r]));
  });
  CHECK(gen2->check({"shm/host/0", "shm/host/1"}));
  CHECK(attempt2->get("shm/host/answer") == "1");
}

TEST_CASE("shm segment: a rank that never maps it times out the creator and nothing is left",
          "[shm]") {
  const std::string prefix = uniqueShmPrefix("test");
  MemoryStore store(std::chrono::seconds(5));
  const shm::SegmentOptions options{.rank = 0, .size = 2, .slotBytes = 4096,
                                    .namePrefix = prefix,
                                    .timeout = std::chrono::milliseconds(300)};
  auto create = [&] { shm::Segment segment(store, options); };
  CHECK_THROWS_AS(create(), ddprun::TimeoutError);
  // The name was published, then removed with the failure.
  CHECK_THAT(store.get("name"), Catch::StartsWith("/" + prefix + "-"));
  CHECK(shmLeftovers(prefix) == 0);
}

namespace {

std::vector<std::shared_ptr<Communicator>> makeHierarchical(int nodes, int local,
                                                            const std::string& prefix) {
  auto store = std::make_shared<MemoryStore>(std::chrono::seconds(20));
  const int P = nodes * local;
  std::vector<std::shared_ptr<Communicator>> comms(P);
  runRanks(P, [&](int r) {
    comms[r] = makeHierarchicalCommunicator(store, {.rank = r,
                                                    .size = P,
                                                    .node = r / local,
                                                    .nodes = nodes,
                                                    .localRank = r % local,
                                                    .localSize = local,
                                                    .timeout = std::chrono::seconds(20),
                                                    .hostname = "127.0.0.1",
                                                    .shmPrefix = prefix});
  });
  return comms;
}

}  // namespace

TEST_CASE("hierarchical allreduce over nodes of ranks as threads equals the reference bit for "
          "bit on every rank", "[shm][hierarchical]") {
  const std::string prefix = uniqueShmPrefix("test");
  for (auto [nodes, local] : {std::pair{2, 2}, std::pair{3, 2}}) {
    const int P = nodes * local;
    auto comms = makeHierarchical(nodes, local, prefix);
    CHECK(comms[0]->backend() == "shm+tcp");
    CHECK(shmLeftovers(prefix) == 0);
    for (auto dtype : kDtypes) {
      for (int64_t n : {0, 1, 7, 65537, 300001}) {
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max}) {
          if (op == ReduceOp::Avg && !c10::isFloatingType(dtype)) continue;
          if (n > 7 && op != ReduceOp::Sum && dtype != torch::kFloat32) continue;  // time budget
          const torch::Tensor expected = reference(P, n, dtype, op);
          std::vector<torch::Tensor> out(P);
          runRanks(P, [&](int r) {
            out[r] = inputFor(r, n, dtype);
            if (n % 2) {
              comms[r]->allreduce(out[r], op);
            } else {
              comms[r]->allreduceAsync(out[r], op)->wait();
            }
          });
          INFO("nodes=" << nodes << " local=" << local << " dtype=" << dtype << " n=" << n
                        << " op=" << toString(op));
          for (int r = 0; r < P; ++r) {
            CHECK(torch::equal(out[r], out[0]));  // the same bits everywhere
            if (op == ReduceOp::Avg) {  // torch may divide differently in the last bit
              CHECK(torch::allclose(out[r].to(torch::kFloat64), expected.to(torch::kFloat64),
                                    1e-2, 1e-2));
            } else {
              CHECK(torch::equal(out[r], expected));
            }
          }
        }
      }
    }
    for (int root = 0; root < P; ++root) {
      std::vector<torch::Tensor> out(P), all(P);
      runRanks(P, [&](int r) {
        out[r] = inputFor(r, 1001, torch::kFloat64);
        comms[r]->broadcast(out[r], root);
        all[r] = comms[r]->allgather(inputFor(r, 3, torch::kInt32));
        comms[r]->barrier();
      });
      for (int r = 0; r < P; ++r) {
        CHECK(torch::equal(out[r], inputFor(root, 1001, torch::kFloat64)));
        for (int q = 0; q < P; ++q) CHECK(torch::equal(all[r][q], inputFor(q, 3, torch::kInt32)));
      }
    }
    const auto errors = test::checkCallerThread(comms);
    for (const auto& e : errors) FAIL_CHECK(e);
    CHECK(errors.empty());
  }
  CHECK(shmLeftovers(prefix) == 0);
}
