// Each collective of the Gloo communicator against a single-process reference, with 2, 3 and 4
// ranks as threads on one MemoryStore (real Gloo TCP connections over loopback).
#include "tests/support/catch_torch.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <chrono>
#include <thread>

#include <gloo/transport/tcp/address.h>

#include "base/errors.h"
#include "rendezvous/memory_store.h"
#include "rendezvous/prefix_store.h"
#include "rendezvous/recovery_keys.h"
#include "rendezvous/superseded_store.h"
#include "tests/support/forwarding_store.h"
#include "tests/worker_runtime/caller_thread.h"
#include "tests/worker_runtime/rank_threads.h"
#include "worker_runtime/gloo_communicator.h"

using namespace ddprun::runtime;
using ddprun::rendezvous::MemoryStore;
using test::runRanks;

namespace {

const std::vector<torch::Dtype> kDtypes = {torch::kFloat32, torch::kFloat64, torch::kFloat16,
                                           torch::kBFloat16, torch::kInt32,  torch::kInt64,
                                           torch::kInt8,     torch::kUInt8};

// Small integers, exact in every supported dtype even when summed over 4 ranks.
torch::Tensor inputFor(int rank, int64_t n, torch::Dtype dtype) {
  auto gen = at::detail::createCPUGenerator(1234 + rank);
  auto t = torch::randint(0, 7, {n}, gen, torch::kInt64);
  if (dtype != torch::kUInt8) t = t - 3;  // negatives too, except for unsigned
  return t.to(dtype);
}

torch::Tensor reference(int P, int64_t n, torch::Dtype dtype, ReduceOp op) {
  torch::Tensor acc = inputFor(0, n, dtype).to(torch::kFloat64);
  for (int r = 1; r < P; ++r) {
    auto x = inputFor(r, n, dtype).to(torch::kFloat64);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: acc = acc + x; break;
      case ReduceOp::Min: acc = torch::minimum(acc, x); break;
      case ReduceOp::Max: acc = torch::maximum(acc, x); break;
    }
  }
  if (op == ReduceOp::Avg) acc = acc / P;
  return acc.to(dtype);
}

std::vector<std::shared_ptr<Communicator>> makeGroup(int P, GlooOptions base = {}) {
  auto store = std::make_shared<MemoryStore>(std::chrono::seconds(20));
  std::vector<std::shared_ptr<Communicator>> comms(P);
  runRanks(P, [&](int r) {
    GlooOptions o = base;
    o.rank = r;
    o.size = P;
    o.hostname = "127.0.0.1";
    if (o.timeout == kDefaultCollectiveTimeout) o.timeout = std::chrono::seconds(20);
    comms[r] = makeGlooCommunicator(store, o);
  });
  return comms;
}

}  // namespace

TEST_CASE("allreduce matches the single-process reference for every dtype, op and size",
          "[collectives][gloo]") {
  for (int P : {2, 3, 4}) {
    auto comms = makeGroup(P);
    for (auto dtype : kDtypes) {
      for (int64_t n : {0, 1, 2, 7, 1001, 65537, 300001}) {
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max}) {
          if (op == ReduceOp::Avg && !c10::isFloatingType(dtype)) continue;
          const torch::Tensor expected = reference(P, n, dtype, op);
          std::vector<torch::Tensor> out(P);
          runRanks(P, [&](int r) {
            out[r] = inputFor(r, n, dtype);
            comms[r]->allreduce(out[r], op);
          });
          INFO("P=" << P << " dtype=" << dtype << " n=" << n << " op=" << toString(op));
          for (int r = 0; r < P; ++r) {
            if (op == ReduceOp::Avg) {
              CHECK(torch::allclose(out[r].to(torch::kFloat64), expected.to(torch::kFloat64),
                                    1e-2, 1e-2));
            } else {
              CHECK(torch::equal(out[r], expected));
            }
            CHECK(torch::equal(out[r], out[0]));  // bit-identical on every rank
          }
        }
      }
    }
  }
}

TEST_CASE("64 MiB allreduce with random floats: close to float64 reference, identical on all ranks",
          "[collectives][gloo][large]") {
  const int64_t n = (64 << 20) / 4;
  for (int P : {2, 4}) {
    auto comms = makeGroup(P);
    std::vector<torch::Tensor> in(P), out(P);
    for (int r = 0; r < P; ++r) {
      in[r] = torch::randn({n}, at::detail::createCPUGenerator(77 + r));
      out[r] = in[r].clone();
    }
    runRanks(P, [&](int r) { comms[r]->allreduce(out[r], ReduceOp::Sum); });
    torch::Tensor ref = torch::zeros({n}, torch::kFloat64);
    for (int r = 0; r < P; ++r) ref += in[r].to(torch::kFloat64);
    for (int r = 0; r < P; ++r) {
      CHECK(torch::allclose(out[r].to(torch::kFloat64), ref, 1e-5, 1e-5));
      CHECK(torch::equal(out[r], out[0]));
    }
  }
}

TEST_CASE("every allreduce algorithm agrees with the reference at every size",
          "[collectives][gloo]") {
  for (auto algo : {AllreduceAlgorithm::Direct, AllreduceAlgorithm::Ring,
                    AllreduceAlgorithm::HalvingDoubling}) {
   for (int P : {2, 3, 4}) {
    auto comms = makeGroup(P, {.allreduce = algo, .ringSegmentBytes = 4096});
    for (int64_t n : {1, 2, 3, 5, 4097, 100003}) {
      const auto expected = reference(P, n, torch::kFloat32, ReduceOp::Sum);
      std::vector<torch::Tensor> out(P);
      runRanks(P, [&](int r) {
        out[r] = inputFor(r, n, torch::kFloat32);
        comms[r]->allreduce(out[r]);
      });
      for (int r = 0; r < P; ++r) CHECK(torch::equal(out[r], expected));
    }
   }
  }
}

TEST_CASE("async allreduces complete in submission order", "[collectives][gloo]") {
  const int P = 2;
  auto comms = makeGroup(P);
  std::vector<std::vector<torch::Tensor>> ts(P);
  runRanks(P, [&](int r) {
    std::vector<std::shared_ptr<Work>> works;
    for (int i = 0; i < 20; ++i) {
      ts[r].push_back(torch::full({1000 * (i + 1)}, float(r + i)));
      works.push_back(comms[r]->allreduceAsync(ts[r].back(), ReduceOp::Sum));
    }
    for (auto& w : works) w->wait();
  });
  for (int i = 0; i < 20; ++i) CHECK(torch::all(ts[0][i] == float(2 * i + 1)).item<bool>());
}

TEST_CASE("blocking collectives run on the caller's thread after the async ones queued before "
          "them", "[collectives][gloo]") {
  for (int P : {2, 3}) {
    INFO("P=" << P);
    const auto errors = test::checkCallerThread(makeGroup(P));
    for (const auto& e : errors) FAIL_CHECK(e);
    CHECK(errors.empty());
  }
}

TEST_CASE("broadcast, allgather and barrier match the reference", "[collectives][gloo]") {
  for (int P : {2, 3, 4}) {
    auto comms = makeGroup(P);
    for (auto dtype : kDtypes) {
      for (int64_t n : {0, 1, 1001, 300001}) {
        for (int root = 0; root < P; ++root) {
          std::vector<torch::Tensor> t(P);
          runRanks(P, [&](int r) {
            t[r] = inputFor(r, n, dtype);
            comms[r]->broadcast(t[r], root);
          });
          for (int r = 0; r < P; ++r) CHECK(torch::equal(t[r], inputFor(root, n, dtype)));
        }
        std::vector<torch::Tensor> g(P);
        runRanks(P, [&](int r) { g[r] = comms[r]->allgather(inputFor(r, n, dtype).view({-1, 1})); });
        for (int r = 0; r < P; ++r) {
          REQUIRE(g[r].sizes() == torch::IntArrayRef({P, n, 1}));
          for (int q = 0; q < P; ++q) CHECK(torch::equal(g[r][q].view({-1}), inputFor(q, n, dtype)));
        }
      }
    }
    runRanks(P, [&](int r) {
      for (int i = 0; i < 5; ++i) comms[r]->barrier();
    });
  }
}

TEST_CASE("bad tensors are refused with a message naming the problem", "[collectives][gloo]") {
  auto comms = makeGroup(2);
  auto& c = *comms[0];
  CHECK_THROWS_WITH(c.allreduce(torch::zeros({4}, torch::kBool)),
                    Catch::Contains("dtype Bool is not supported"));
  CHECK_THROWS_WITH(c.allreduce(torch::zeros({4, 4}).t()), Catch::Contains("contiguous"));
  CHECK_THROWS_WITH(c.allreduce(torch::zeros({4}, torch::kInt32), ReduceOp::Avg),
                    Catch::Contains("avg needs a floating dtype"));
  CHECK_THROWS_WITH(c.broadcast(torch::zeros({4}), 5), Catch::Contains("root 5 is not a rank"));
  CHECK_THROWS_AS(c.allreduce(torch::Tensor()), ddprun::ConfigError);
}

TEST_CASE("ranks that disagree on an allreduce's size or dtype all fail naming both shapes",
          "[collectives][gloo]") {
  struct Case {
    const char* name;
    int64_t n0, n1;
    torch::Dtype t0, t1;
    std::string shape0, shape1;
  };
  // Small (direct), large (ring), one of each (different algorithms), and dtypes.
  const std::vector<Case> cases = {
      {"sizes, direct", 10, 12, torch::kFloat32, torch::kFloat32, "10 elements of Float",
       "12 elements of Float"},
      {"sizes, halving-doubling", 1 << 20, (1 << 20) + 1, torch::kFloat32, torch::kFloat32,
       "1048576 elements of Float (sum, halving-doubling)",
       "1048577 elements of Float (sum, halving-doubling)"},
      {"sizes, ring", 9 << 20, (9 << 20) + 1, torch::kFloat32, torch::kFloat32,
       "9437184 elements of Float (sum, ring)", "9437185 elements of Float (sum, ring)"},
      {"sizes, different algorithms", 10, 1 << 20, torch::kFloat32, torch::kFloat32,
       "10 elements of Float (sum, direct)", "1048576 elements of Float (sum, halving-doubling)"},
      {"dtypes", 10, 10, torch::kFloat32, torch::kFloat64, "10 elements of Float",
       "10 elements of Double"},
      // An empty tensor is framed too: the other rank fails at once instead of timing out.
      {"an empty tensor against a small one", 0, 10, torch::kFloat32, torch::kFloat32,
       "0 elements of Float (sum, direct)", "10 elements of Float (sum, direct)"},
      {"an empty tensor against a large one", 0, 1 << 20, torch::kFloat32, torch::kFloat32,
       "0 elements of Float (sum, direct)", "1048576 elements of Float (sum, halving-doubling)"},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    auto comms = makeGroup(2);
    std::vector<std::string> errors(2);
    runRanks(2, [&](int r) {
      // One matching allreduce first: the sequence numbers agree, the mesh works.
      auto ok = torch::ones({5});
      comms[r]->allreduce(ok);
      auto t = torch::ones({r == 0 ? c.n0 : c.n1}, r == 0 ? c.t0 : c.t1);
      try {
        comms[r]->allreduce(t);
      } catch (const ddprun::BackendError& e) {
        errors[r] = e.what();
      }
    });
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r << ": " << errors[r]);
      CHECK_THAT(errors[r], Catch::Contains("allreduce mismatch between ranks") &&
                                Catch::Contains("rank 0: allreduce #1 of " + c.shape0) &&
                                Catch::Contains("rank 1: allreduce #1 of " + c.shape1));
    }
  }
}

TEST_CASE("empty allreduces on every rank complete and keep the ranks in step",
          "[collectives][gloo]") {
  for (auto algorithm : {AllreduceAlgorithm::Auto, AllreduceAlgorithm::Ring,
                         AllreduceAlgorithm::HalvingDoubling}) {
    INFO("algorithm " << static_cast<int>(algorithm));
    auto comms = makeGroup(2, {.allreduce = algorithm});
    std::vector<float> after(2);
    runRanks(2, [&](int r) {
      auto empty = torch::ones({0});
      comms[r]->allreduce(empty);
      comms[r]->allreduce(empty);
      auto t = torch::full({3}, static_cast<float>(r + 1));
      comms[r]->allreduce(t);  // sequence numbers still agree: #2 on both ranks
      after[r] = t[2].item<float>();
    });
    CHECK(after[0] == 3.0f);
    CHECK(after[1] == 3.0f);
  }
}

TEST_CASE("a group of one needs no peers", "[collectives][gloo]") {
  auto comms = makeGroup(1);
  auto t = torch::arange(10, torch::kFloat32);
  comms[0]->allreduce(t, ReduceOp::Avg);
  CHECK(torch::equal(t, torch::arange(10, torch::kFloat32)));
  CHECK(torch::equal(comms[0]->allgather(t)[0], t));
  comms[0]->barrier();
}

TEST_CASE("GLOO_SOCKET_IFNAME picks the interface, an unknown one is refused by name",
          "[collectives][gloo]") {
  auto store = std::make_shared<MemoryStore>(std::chrono::seconds(5));
  ::setenv("GLOO_SOCKET_IFNAME", "nope0", 1);
  CHECK_THROWS_WITH(makeGlooCommunicator(store, {.rank = 0, .size = 1}),
                    Catch::Contains("GLOO_SOCKET_IFNAME=nope0"));
  ::setenv("GLOO_SOCKET_IFNAME", "lo", 1);
  store = std::make_shared<MemoryStore>(std::chrono::seconds(5));  // the failure counted above
  std::vector<std::shared_ptr<Communicator>> comms(2);
  runRanks(2, [&](int r) {
    comms[r] = makeGlooCommunicator(store, {.rank = r, .size = 2, .timeout = std::chrono::seconds(20)});
  });
  ::unsetenv("GLOO_SOCKET_IFNAME");
  std::vector<torch::Tensor> t{torch::ones({5}), torch::ones({5})};
  runRanks(2, [&](int r) { comms[r]->allreduce(t[r]); });
  CHECK(torch::equal(t[0], torch::full({5}, 2.0f)));
}

TEST_CASE("a superseded generation's gloo set-up: a rank that comes after a peer gave it up "
          "gives up too, instead of connecting a pair to the departed peer",
          "[collectives][gloo][recovery]") {
  namespace keys = ddprun::rendezvous::recovery;
  using Clock = std::chrono::steady_clock;
  // Generation 1 of ranks 0, 1, 2: rank 2 is dead from the start (it never writes a key); rank
  // 0 writes its addresses, then gives the generation up when generation 2 is published; rank 1
  // (a replacement that loaded slowly) comes after that. It finds rank 0's addresses; before,
  // it connected its pair with rank 0 first and, when its side of the pair was the listening
  // one, waited Gloo's timeout for a peer that was gone. Several rounds: which side listens
  // depends on the ports.
  for (int round = 0; round < 4; ++round) {
    auto attempt = std::make_shared<MemoryStore>(std::chrono::seconds(20));
    auto generation = [&] {
      return std::make_shared<ddprun::rendezvous::SupersededStore>(
          std::make_shared<ddprun::rendezvous::PrefixStore>(keys::generationScope(1), attempt),
          attempt, 1);
    };
    const GlooOptions options0{.rank = 0, .size = 3, .timeout = std::chrono::seconds(5),
                               .hostname = "127.0.0.1"};
    std::string error0;
    std::thread rank0([&] {
      try {
        makeGlooCommunicator(generation(), options0);
      } catch (const ddprun::BackendError& e) {
        error0 = e.what();
      }
    });
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (!attempt->check({keys::generationScope(1) + "/gloo/1/0"}) && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    attempt->set(keys::generationKey(2), "superseded");
    rank0.join();
    CHECK_THAT(error0, Catch::Contains("generation 2 was published"));
    const auto start = Clock::now();
    std::string error1;
    try {
      makeGlooCommunicator(generation(), {.rank = 1, .size = 3,
                                          .timeout = std::chrono::seconds(5),
                                          .hostname = "127.0.0.1"});
    } catch (const ddprun::Error& e) {
      error1 = e.what();
    }
    INFO("round " << round << ": " << error1);
    CHECK_THAT(error1, Catch::Contains("generation 2 was published"));
    CHECK(Clock::now() - start < std::chrono::seconds(2));
  }
}

TEST_CASE("a gloo set-up whose peer published its addresses and died before connecting gives "
          "up within its set-up bound, not at the collective timeout",
          "[collectives][gloo][recovery]") {
  using Clock = std::chrono::steady_clock;
  auto store = std::make_shared<MemoryStore>(std::chrono::seconds(60));
  const GlooOptions options{.rank = 0, .size = 2, .timeout = std::chrono::seconds(60),
                            .setupTimeout = std::chrono::seconds(1), .hostname = "127.0.0.1"};
  SECTION("Gloo's pair: this rank's side listens for a peer that never connects") {
    // Rank 1's address as Gloo writes it (one per peer, under "<rank>"), on 127.0.0.2: it
    // compares above 127.0.0.1, so rank 0's side of the pair is the listening one. Nothing
    // ever connects from there: rank 1 died right after writing it.
    sockaddr_storage ss{};
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    in->sin_family = AF_INET;
    in->sin_port = htons(9);
    in->sin_addr.s_addr = htonl(0x7f000002);
    const auto bytes = gloo::transport::tcp::Address(ss, 0).bytes();
    store->set("gloo/1/rank_1", "host");
    store->set("gloo/1/1", std::string(bytes.begin(), bytes.end()));
    const auto start = Clock::now();
    std::string error;
    try {
      makeGlooCommunicator(store, options);
    } catch (const ddprun::BackendError& e) {
      error = e.what();
    }
    const auto took = Clock::now() - start;
    INFO(error);
    CHECK_THAT(error,
               Catch::Contains("rank 0 of 2 could not connect to its peers (bound 1.000 s)"));
    CHECK(took >= std::chrono::milliseconds(900));
    CHECK(took < std::chrono::seconds(10));
  }
  SECTION("the allreduce mesh: the peer connected Gloo's pairs, then died before the mesh") {
    // Rank 1 is real; its store fails its read of rank 0's mesh address, so it leaves (its
    // side of Gloo closed) after publishing its own and before connecting to rank 0's.
    struct DiesBeforeMesh final : ddprun::testing::ForwardingStore {
      using ForwardingStore::ForwardingStore;
      std::string get(const std::string& k) override {
        if (k == "gloo/1/mesh/0") throw ddprun::BackendError("rank 1 died (test)");
        return ForwardingStore::get(k);
      }
    };
    std::string error0;
    std::string error1;
    Clock::duration took0{};
    runRanks(2, [&](int r) {
      const auto start = Clock::now();
      try {
        if (r == 0) {
          makeGlooCommunicator(store, options);
        } else {
          GlooOptions o = options;
          o.rank = 1;
          makeGlooCommunicator(std::make_shared<DiesBeforeMesh>(store), o);
        }
      } catch (const ddprun::Error& e) {
        (r == 0 ? error0 : error1) = e.what();
      }
      if (r == 0) took0 = Clock::now() - start;
    });
    CHECK_THAT(error1, Catch::Contains("rank 1 died (test)"));
    INFO(error0);
    CHECK_THAT(error0, Catch::Contains("mesh: rank 0 waited in vain for 1 higher rank(s)"));
    CHECK(took0 < std::chrono::seconds(10));
  }
}

TEST_CASE("abort() wakes the peers waiting on this rank in a Gloo collective: they fail at "
          "once (a closed connection), not at the collective timeout",
          "[collectives][gloo][recovery]") {
  // Rank 0 left the collective (in-process recovery: another peer died while it waited on that
  // one) and aborts; the others are still inside the same Gloo collective, waiting on rank 0 or
  // on each other. Each that fails aborts too, as runElastic does. Before, a peer that waited on
  // rank 0 waited the whole timeout: rank 0 was alive and its connections open (two nodes, a
  // rank a step behind in the first barrier; nodes_recovery_test.cpp). The timeout here is 20 s:
  // a TimeoutError, not a BackendError, is what that bug looked like.
  using Clock = std::chrono::steady_clock;
  const char* const kinds[] = {"barrier", "broadcast", "allgather"};
  for (const int P : {2, 3, 4}) {
    for (const std::string kind : kinds) {
      auto comms = makeGroup(P, {.timeout = std::chrono::seconds(20)});
      std::vector<std::string> errors(P);
      std::vector<double> abortMs(P, -1);
      auto abortTimed = [&](int r) {
        const auto start = Clock::now();
        comms[r]->abort();
        abortMs[r] = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      };
      runRanks(P, [&](int r) {
        if (r == 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the others wait first
          abortTimed(0);
          return;
        }
        try {
          if (kind == "barrier") comms[r]->barrier();
          if (kind == "broadcast") comms[r]->broadcast(torch::ones({1000}), 0);
          if (kind == "allgather") comms[r]->allgather(torch::ones({1000}));
          errors[r] = "no error";
        } catch (const ddprun::BackendError& e) {
          errors[r] = e.what();
          abortTimed(r);
        } catch (const ddprun::Error& e) {
          errors[r] = std::string("not a BackendError: ") + e.what();
        }
      });
      for (int r = 1; r < P; ++r) {
        INFO(P << " ranks, " << kind << ", rank " << r << ": " << errors[r]);
        CHECK_THAT(errors[r], Catch::StartsWith("gloo " + kind) &&
                                  (Catch::Contains("did a peer exit?") ||
                                   Catch::Contains("aborted by this rank")));
      }
      // What abort() costs a recovery (Gloo unregisters each pair from its event loop).
      for (int r = 0; r < P; ++r) UNSCOPED_INFO("abort() on rank " << r << ": " << abortMs[r] << " ms");
      // Every later call on an aborted communicator fails at once.
      CHECK_THROWS_AS(comms[0]->barrier(), ddprun::BackendError);
    }
  }
}

TEST_CASE("a generation's set-up waits DDPRUN_RECOVERY_TIMEOUT at most for a peer that never "
          "joins, though no newer generation comes, and says so naming the keys",
          "[collectives][gloo][recovery]") {
  namespace keys = ddprun::rendezvous::recovery;
  using Clock = std::chrono::steady_clock;
  // Rank 1 of generation 1 never writes its addresses (alive elsewhere: stuck in an old
  // generation's collective), and generation 2 is never published. The collective timeout (20 s
  // here, 30 min by default) is not what bounds rank 0's wait: the recovery bound is.
  auto attempt = std::make_shared<MemoryStore>(std::chrono::seconds(20));
  auto generation = std::make_shared<ddprun::rendezvous::SupersededStore>(
      std::make_shared<ddprun::rendezvous::PrefixStore>(keys::generationScope(1), attempt),
      attempt, 1, std::chrono::milliseconds(600));
  const auto start = Clock::now();
  std::string error;
  try {
    makeGlooCommunicator(generation, {.rank = 0, .size = 2, .timeout = std::chrono::seconds(20),
                                      .hostname = "127.0.0.1"});
  } catch (const ddprun::TimeoutError& e) {
    error = e.what();
  }
  INFO(error);
  CHECK_THAT(error, Catch::Contains("generation 1's set-up waited 0.600 s "
                                    "(DDPRUN_RECOVERY_TIMEOUT) for key 'gloo/1/1'") &&
                        Catch::Contains("a peer of this generation is alive but not joining it"));
  CHECK(Clock::now() - start < std::chrono::seconds(10));
  // A bound longer than the wait's own timeout leaves the store's own TimeoutError.
  auto loose = std::make_shared<ddprun::rendezvous::SupersededStore>(
      std::make_shared<ddprun::rendezvous::PrefixStore>(keys::generationScope(1), attempt),
      attempt, 1, std::chrono::seconds(60));
  try {
    loose->wait({"never"}, std::chrono::milliseconds(300));
    FAIL("the wait for a key nobody writes returned");
  } catch (const ddprun::TimeoutError& e) {
    CHECK_THAT(e.what(), !Catch::Contains("DDPRUN_RECOVERY_TIMEOUT"));
  }
}
