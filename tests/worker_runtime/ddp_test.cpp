// DistributedDataParallel with N ranks as threads on one MemoryStore (real Gloo over loopback):
// gradients equal the single-process gradient of the concatenated batch, weights stay bit-identical
// across ranks, no_sync accumulates locally, buckets follow PyTorch's rules.
#include "tests/support/catch_torch.h"

#include "base/errors.h"
#include "rendezvous/memory_store.h"
#include "tests/worker_runtime/rank_threads.h"
#include "worker_runtime/ddp.h"
#include "worker_runtime/gloo_communicator.h"
#include "worker_runtime/shm/shm_communicator.h"

using namespace ddprun::runtime;
using test::runRanks;

namespace {

struct Mlp : torch::nn::Module {
  explicit Mlp(int hidden = 32, bool withBatchNorm = false) {
    fc1 = register_module("fc1", torch::nn::Linear(10, hidden));
    if (withBatchNorm) bn = register_module("bn", torch::nn::BatchNorm1d(hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, hidden));
    fc3 = register_module("fc3", torch::nn::Linear(hidden, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = fc1(x);
    if (bn) x = bn(x);
    return fc3(torch::tanh(fc2(torch::relu(x))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

std::vector<std::shared_ptr<Communicator>> makeGroup(int P) {
  auto store = std::make_shared<ddprun::rendezvous::MemoryStore>(std::chrono::seconds(20));
  std::vector<std::shared_ptr<Communicator>> comms(P);
  runRanks(P, [&](int r) {
    comms[r] = makeGlooCommunicator(
        store, {.rank = r, .size = P, .timeout = std::chrono::seconds(20), .hostname = "127.0.0.1"});
  });
  return comms;
}

// The same over shared memory (worker_runtime/shm), where DDP's buckets live in lent memory.
std::vector<std::shared_ptr<Communicator>> makeShmGroup(int P) {
  auto store = std::make_shared<ddprun::rendezvous::MemoryStore>(std::chrono::seconds(20));
  std::vector<std::shared_ptr<Communicator>> comms(P);
  runRanks(P, [&](int r) {
    comms[r] = shm::makeShmCommunicator(store, {.rank = r, .size = P,
                                                .timeout = std::chrono::seconds(20),
                                                .namePrefix = "ddprun-ddp-test"});
  });
  return comms;
}

using GroupMaker = std::vector<std::shared_ptr<Communicator>> (*)(int);
const std::vector<std::pair<const char*, GroupMaker>> kTransports = {{"gloo", makeGroup},
                                                                     {"shm", makeShmGroup}};

// The batch of rank r at step s (each rank's share of a global batch).
std::pair<torch::Tensor, torch::Tensor> batch(int r, int step, int perRank = 8) {
  auto gen = at::detail::createCPUGenerator(1000 * step + r);
  return {torch::randn({perRank, 10}, gen), torch::randn({perRank, 4}, gen)};
}

torch::Tensor lossOf(Mlp& m, const torch::Tensor& x, const torch::Tensor& y) {
  return torch::mse_loss(m.forward(x), y);
}

// Ranks are threads here and torch's default generator is shared, so models are initialised
// from per-rank generators, and references copy the weights they compare against.
std::shared_ptr<Mlp> makeModel(int seed, int hidden = 32, bool withBatchNorm = false) {
  auto m = std::make_shared<Mlp>(hidden, withBatchNorm);
  auto gen = at::detail::createCPUGenerator(seed);
  torch::NoGradGuard noGrad;
  for (auto& p : m->parameters()) p.copy_(torch::randn(p.sizes(), gen) * 0.3);
  return m;
}

void copyWeights(Mlp& dst, Mlp& src) {
  torch::NoGradGuard noGrad;
  auto d = dst.parameters(), s = src.parameters();
  for (size_t i = 0; i < d.size(); ++i) d[i].copy_(s[i]);
}

}  // namespace

TEST_CASE("DDP gradients equal the single-process gradient of the concatenated batch",
          "[ddp]") {
  for (int P : {2, 3, 4}) {
    auto comms = makeGroup(P);
    std::vector<std::shared_ptr<Mlp>> models(P);
    std::vector<std::vector<torch::Tensor>> grads(P);
    auto initial = makeModel(100);  // rank 0's weights: DDP must broadcast them
    runRanks(P, [&](int r) {
      models[r] = makeModel(100 + r);
      DistributedDataParallel ddp(models[r], comms[r]);
      auto [x, y] = batch(r, 0);
      lossOf(*models[r], x, y).backward();
      for (auto& p : models[r]->parameters()) grads[r].push_back(p.grad().clone());
      CHECK(ddp.syncedBackwards() == 1);
    });
    // Reference: rank 0's initial model on the whole batch (the mean over P equal shares equals
    // the mean of the P per-rank means).
    Mlp ref;
    copyWeights(ref, *initial);
    std::vector<torch::Tensor> xs, ys;
    for (int r = 0; r < P; ++r) {
      auto [x, y] = batch(r, 0);
      xs.push_back(x);
      ys.push_back(y);
    }
    lossOf(ref, torch::cat(xs), torch::cat(ys)).backward();
    auto refParams = ref.parameters();
    for (int r = 0; r < P; ++r) {
      for (size_t i = 0; i < refParams.size(); ++i) {
        INFO("P=" << P << " rank " << r << " parameter " << i);
        CHECK(torch::allclose(grads[r][i], refParams[i].grad(), 1e-5, 1e-6));
        CHECK(torch::equal(grads[r][i], grads[0][i]));
      }
    }
  }
}

TEST_CASE("after N steps the weights agree across ranks bit for bit", "[ddp]") {
  for (auto [transport, make] : kTransports) {
    INFO("transport " << transport);
    const int P = 3;
    auto comms = make(P);
    std::vector<std::vector<torch::Tensor>> weights(P);
    runRanks(P, [&](int r) {
      auto model = makeModel(7 + r, 48, /*withBatchNorm=*/true);
      // Small buckets, so that several allreduces overlap backward.
      DistributedDataParallel ddp(model, comms[r], {.bucketCapBytes = 1024, .firstBucketCapBytes = 512});
      CHECK(ddp.buckets().size() > 2);
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
      for (int step = 0; step < 20; ++step) {
        opt.zero_grad();
        auto [x, y] = batch(r, step);
        lossOf(*model, x, y).backward();
        opt.step();
      }
      for (auto& p : model->parameters()) weights[r].push_back(p.detach().clone());
      for (auto& b : model->buffers()) weights[r].push_back(b.detach().clone());
    });
    for (int r = 1; r < P; ++r) {
      REQUIRE(weights[r].size() == weights[0].size());
      for (size_t i = 0; i < weights[0].size(); ++i) CHECK(torch::equal(weights[r][i], weights[0][i]));
    }
  }
}

TEST_CASE("DDP over shm: the buckets are lent shared memory and .grad() views into them, nothing is "
          "copied, the allreduce reads them in place, and the weights agree bit for bit across "
          "ranks and with Gloo's", "[ddp][shm]") {
  for (int P : {2, 3}) {
    auto viaShm = makeShmGroup(P);
    auto viaGloo = makeGroup(P);
    std::vector<std::vector<torch::Tensor>> weights(P), glooWeights(P);
    runRanks(P, [&](int r) {
      for (bool shared : {true, false}) {
        auto& comm = shared ? viaShm[r] : viaGloo[r];
        auto model = makeModel(7 + r, 128);  // one bucket of 74 KiB: the in-place allreduce
        DistributedDataParallel ddp(model, comm);
        REQUIRE(ddp.buckets().size() == 1);
        CHECK(ddp.sharedBuckets() == shared);
        int64_t bytes = 0;
        for (auto& p : model->parameters()) bytes += static_cast<int64_t>(p.nbytes());
        torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
        const int steps = 8;
        int64_t copiedFirst = 0;
        AllreduceBytes first;
        for (int step = 0; step < steps; ++step) {
          opt.zero_grad();
          auto [x, y] = batch(r, step);
          lossOf(*model, x, y).backward();
          if (step == 0) {
            copiedFirst = ddp.copiedBytes();
            first = comm->allreduceBytes();
          }
          opt.step();
        }
        auto params = model->parameters();
        if (!shared) {
          CHECK(ddp.copiedBytes() == 2 * steps * bytes);  // every gradient in and out, each step
          for (auto& p : params) glooWeights[r].push_back(p.detach().clone());
          continue;
        }
        // The first backward found no .grad() to accumulate into: AccumulateGrad made its own,
        // copied in once; from then on backward accumulates in the bucket.
        CHECK(copiedFirst == bytes);
        CHECK(ddp.copiedBytes() == copiedFirst);
        const AllreduceBytes last = comm->allreduceBytes();
        CHECK(last.staged == 0);
        CHECK(last.inPlace - first.inPlace == static_cast<uint64_t>((steps - 1) * bytes));
        // Every .grad() lies in the one bucket: together they span exactly its bytes.
        auto packed = [&] {
          uintptr_t lo = UINTPTR_MAX, hi = 0;
          for (auto& p : params) {
            const auto at = reinterpret_cast<uintptr_t>(p.grad().data_ptr());
            lo = std::min(lo, at);
            hi = std::max(hi, at + p.grad().nbytes());
          }
          return static_cast<int64_t>(hi - lo) == bytes;
        };
        CHECK(packed());
        for (auto& p : params) weights[r].push_back(p.detach().clone());
        // A .grad() replaced (set to none) is copied in once, then is a view again.
        for (auto& p : params) p.mutable_grad() = torch::Tensor();
        for (int step = 0; step < 2; ++step) {
          if (step > 0) opt.zero_grad();
          auto [x, y] = batch(r, steps + step);
          lossOf(*model, x, y).backward();
          opt.step();
        }
        CHECK(ddp.copiedBytes() == 2 * bytes);
        CHECK(packed());
      }
    });
    for (int r = 0; r < P; ++r) {
      INFO("P=" << P << " rank " << r);
      REQUIRE(weights[r].size() == weights[0].size());
      for (size_t i = 0; i < weights[0].size(); ++i) {
        CHECK(torch::equal(weights[r][i], weights[0][i]));
      }
    }
    // Two ranks: both transports add the same two numbers, so the same bits; more ranks may
    // add in another order.
    for (int r = 0; r < P; ++r) {
      REQUIRE(glooWeights[r].size() == weights[0].size());
      for (size_t i = 0; i < weights[0].size(); ++i) {
        CHECK(torch::allclose(glooWeights[r][i], weights[0][i], 1e-5, 1e-6));
        if (P == 2) CHECK(torch::equal(glooWeights[r][i], weights[0][i]));
      }
    }
  }
}

TEST_CASE("construction broadcasts rank 0's parameters unless initSync is off", "[ddp]") {
  const int P = 2;
  auto comms = makeGroup(P);
  std::vector<std::vector<torch::Tensor>> synced(P), kept(P), before(P);
  runRanks(P, [&](int r) {
    auto a = makeModel(3 + r);  // different weights on each rank
    DistributedDataParallel ddp(a, comms[r]);
    for (auto& p : a->parameters()) synced[r].push_back(p.detach().clone());
    auto b = makeModel(3 + r);
    for (auto& p : b->parameters()) before[r].push_back(p.detach().clone());
    // What a recovery does after healing (the ranks hold equal values already): no broadcast.
    DistributedDataParallel kept_ddp(b, comms[r], {.initSync = false});
    for (auto& p : b->parameters()) kept[r].push_back(p.detach().clone());
  });
  for (size_t i = 0; i < synced[0].size(); ++i) {
    CHECK(torch::equal(synced[1][i], synced[0][i]));
    CHECK(torch::equal(kept[1][i], before[1][i]));  // rank 1 kept its own
  }
  CHECK_FALSE(torch::equal(kept[1][0], kept[0][0]));
}

TEST_CASE("no_sync accumulates locally, the next backward syncs the accumulated sum", "[ddp]") {
  for (auto [transport, make] : kTransports) {
    INFO("transport " << transport);
    const int P = 2;
    auto comms = make(P);
    std::vector<torch::Tensor> local(P), synced(P), expected(P);
    runRanks(P, [&](int r) {
      auto model = makeModel(1 + r);
      DistributedDataParallel ddp(model, comms[r]);
      auto solo = std::make_shared<Mlp>();  // what this rank would have alone (reference below)
      copyWeights(*solo, *model);
      {
        auto guard = ddp.noSync();
        auto [x, y] = batch(r, 1);
        lossOf(*model, x, y).backward();
      }
      CHECK(ddp.syncedBackwards() == 0);
      local[r] = model->fc1->weight.grad().clone();
      auto [x, y] = batch(r, 2);
      lossOf(*model, x, y).backward();
      CHECK(ddp.syncedBackwards() == 1);
      synced[r] = model->fc1->weight.grad().clone();
      for (int s : {1, 2}) {
        auto [xs, ys] = batch(r, s);
        lossOf(*solo, xs, ys).backward();
      }
      expected[r] = solo->fc1->weight.grad().clone();
    });
    CHECK_FALSE(torch::equal(local[0], local[1]));  // no communication inside no_sync
    const torch::Tensor avg = (expected[0] + expected[1]) / 2;
    CHECK(torch::allclose(synced[0], avg, 1e-5, 1e-6));
    CHECK(torch::equal(synced[0], synced[1]));
  }
}

TEST_CASE("a parameter unused in a pass still gets the same gradient on every rank", "[ddp]") {
  for (auto [transport, make] : kTransports) {
    INFO("transport " << transport);
    const int P = 2;
    auto comms = make(P);
    std::vector<torch::Tensor> g(P);
    runRanks(P, [&](int r) {
      auto model = makeModel(3);
      DistributedDataParallel ddp(model, comms[r], {.firstBucketCapBytes = 64});
      auto [x, y] = batch(r, 0);
      // Rank 1 skips fc2 (and so never produces its gradient); the pass must still complete.
      torch::Tensor h = torch::relu(model->fc1(x));
      if (r == 0) h = torch::tanh(model->fc2(h));
      torch::mse_loss(model->fc3(h), y).backward();
      g[r] = model->fc2->weight.grad().clone();
    });
    CHECK(torch::equal(g[0], g[1]));
  }
}

TEST_CASE("different models on different ranks: a clear error on every rank", "[ddp]") {
  const int P = 2;
  auto comms = makeGroup(P);
  std::vector<std::string> errors(P);
  runRanks(P, [&](int r) {
    auto model = std::make_shared<Mlp>(r == 0 ? 32 : 16);
    try {
      DistributedDataParallel ddp(model, comms[r]);
    } catch (const ddprun::ConfigError& e) {
      errors[r] = e.what();
    }
  });
  CHECK_THAT(errors[1], Catch::Contains("rank 0 has parameter fc1.weight (Float [32, 10])") &&
                            Catch::Contains("rank 1 has parameter fc1.weight (Float [16, 10])"));
  CHECK_THAT(errors[0], Catch::Contains("rank(s) 1 hold a different model"));
}

TEST_CASE("buckets: reverse order, 1 MiB first, 25 MiB after, one dtype each", "[ddp][buckets]") {
  const size_t MiB = 1 << 20;
  using torch::kFloat;
  // Registration order: 4 x 0.5 MiB, then 30 MiB, then 10 x 3 MiB.
  std::vector<size_t> bytes{MiB / 2, MiB / 2, MiB / 2, MiB / 2, 30 * MiB};
  for (int i = 0; i < 10; ++i) bytes.push_back(3 * MiB);
  std::vector<torch::Dtype> types(bytes.size(), kFloat);
  auto buckets = assignBuckets(bytes, types, {});
  REQUIRE(buckets.size() == 4);
  CHECK((buckets[0].params == std::vector<size_t>{14}));  // 3 MiB >= 1 MiB: the first bucket closes
  CHECK((buckets[1].params == std::vector<size_t>{13, 12, 11, 10, 9, 8, 7, 6, 5}));  // 27 MiB
  CHECK((buckets[2].params == std::vector<size_t>{4}));   // 30 MiB alone
  CHECK((buckets[3].params == std::vector<size_t>{3, 2, 1, 0}));
  // Mixed dtypes never share a bucket.
  auto mixed = assignBuckets({100, 100, 100}, {kFloat, torch::kDouble, kFloat}, {});
  REQUIRE(mixed.size() == 2);
  CHECK((mixed[0].params == std::vector<size_t>{2, 0}));
  CHECK(mixed[0].dtype == kFloat);
  CHECK((mixed[1].params == std::vector<size_t>{1}));
}
