// DistributedSampler: the properties PyTorch's sampler has (its exact permutation is compared with
// torch 1.13 itself in sampler_vs_torch.py).
#include "tests/support/catch_torch.h"

#include <set>

#include "base/errors.h"
#include "worker_runtime/sampler.h"

using namespace ddprun::runtime;

namespace {
std::vector<std::vector<size_t>> allRanks(DistributedSamplerOptions o, int64_t epoch) {
  std::vector<std::vector<size_t>> out;
  for (int r = 0; r < o.numReplicas; ++r) {
    o.rank = r;
    DistributedSampler s(o);
    s.setEpoch(epoch);
    out.push_back(s.indices());
  }
  return out;
}
}  // namespace

TEST_CASE("ranks get equal counts, disjoint shares and together the whole dataset", "[sampler]") {
  for (size_t n : {0, 1, 5, 10, 11, 97, 1000}) {
    for (int R : {1, 2, 3, 4, 7}) {
      for (bool shuffle : {false, true}) {
        INFO("n=" << n << " replicas=" << R << " shuffle=" << shuffle);
        auto ranks = allRanks({.datasetSize = n, .numReplicas = R, .shuffle = shuffle, .seed = 3}, 2);
        const size_t expected = (n + R - 1) / R;  // ceil: padded
        std::multiset<size_t> all;
        for (auto& idx : ranks) {
          CHECK(idx.size() == expected);
          for (size_t i : idx) {
            CHECK(i < n);
            all.insert(i);
          }
        }
        std::set<size_t> distinct(all.begin(), all.end());
        CHECK(distinct.size() == n);                  // every sample is seen
        CHECK(all.size() - n == expected * R - n);    // repeats are exactly the padding
        CHECK(all.size() - n < static_cast<size_t>(R));  // less than one round of padding
      }
    }
  }
}

TEST_CASE("drop_last drops the tail instead of padding", "[sampler]") {
  auto ranks = allRanks({.datasetSize = 11, .numReplicas = 4, .shuffle = true, .dropLast = true}, 0);
  std::set<size_t> seen;
  for (auto& idx : ranks) {
    CHECK(idx.size() == 2);  // floor(11 / 4)
    for (size_t i : idx) CHECK(seen.insert(i).second);  // no repeats at all
  }
  CHECK(allRanks({.datasetSize = 3, .numReplicas = 4, .dropLast = true}, 0)[0].empty());
}

TEST_CASE("without shuffle rank r takes r, r+R, ... with padding from the start", "[sampler]") {
  auto ranks = allRanks({.datasetSize = 10, .numReplicas = 4, .shuffle = false}, 0);
  CHECK((ranks[0] == std::vector<size_t>{0, 4, 8}));
  CHECK((ranks[1] == std::vector<size_t>{1, 5, 9}));
  CHECK((ranks[2] == std::vector<size_t>{2, 6, 0}));
  CHECK((ranks[3] == std::vector<size_t>{3, 7, 1}));
  // Very short datasets repeat more than once.
  const std::vector<int64_t> expected{0, 1, 0, 1, 0};
  CHECK(distributedEpochOrder({.datasetSize = 2, .numReplicas = 5, .shuffle = false}, 0) == expected);
}

TEST_CASE("the order depends on seed + epoch only, and set_epoch changes it", "[sampler]") {
  DistributedSamplerOptions o{.datasetSize = 1000, .numReplicas = 2, .rank = 1, .seed = 42};
  DistributedSampler a(o), b(o);
  CHECK(a.indices() == b.indices());
  a.setEpoch(1);
  CHECK(a.indices() != b.indices());
  b.setEpoch(1);
  CHECK(a.indices() == b.indices());
  // seed 42 epoch 1 == seed 43 epoch 0, as in PyTorch (the generator is seeded with the sum).
  DistributedSampler c({.datasetSize = 1000, .numReplicas = 2, .rank = 1, .seed = 43});
  CHECK(c.indices() == a.indices());
}

TEST_CASE("the torch::data sampler interface hands out the epoch and resumes mid-epoch",
          "[sampler]") {
  DistributedSampler s({.datasetSize = 25, .numReplicas = 2, .rank = 0, .seed = 1});
  std::vector<size_t> got;
  while (auto batch = s.next(4)) got.insert(got.end(), batch->begin(), batch->end());
  CHECK(got == s.indices());
  s.reset();
  s.next(5);
  const SamplerState saved = s.state();
  CHECK(saved.position == 5);
  DistributedSampler t({.datasetSize = 25, .numReplicas = 2, .rank = 0, .seed = 1});
  t.restore(saved);
  CHECK(*t.next(100) == std::vector<size_t>(s.indices().begin() + 5, s.indices().end()));
  CHECK_THROWS_WITH(t.restore({0, 99}), Catch::Contains("saved position 99"));
}

TEST_CASE("bad sampler options name the value", "[sampler]") {
  CHECK_THROWS_WITH(DistributedSampler({.datasetSize = 5, .numReplicas = 0}),
                    Catch::Contains("numReplicas=0"));
  CHECK_THROWS_WITH(DistributedSampler({.datasetSize = 5, .numReplicas = 2, .rank = 2}),
                    Catch::Contains("rank=2"));
}
