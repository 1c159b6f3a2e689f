// DistributedSampler: the properties PyTorch's sampler has (its exact permutation is compared with
// torch 1.13 itself in sampler_vs_torch.py).
#include "tests/support/catch_torch.h"

#include <map>
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
  CHECK(saved.position == 10);  // 5 indices on each of the 2 ranks
  CHECK(saved.datasetSize == 25);
  DistributedSampler t({.datasetSize = 25, .numReplicas = 2, .rank = 0, .seed = 1});
  t.restore(saved);
  CHECK(*t.next(100) == std::vector<size_t>(s.indices().begin() + 5, s.indices().end()));
  CHECK_THROWS_WITH(t.restore({.epoch = 0, .position = 99}), Catch::Contains("saved position 99"));
  CHECK_THROWS_WITH(t.restore({.epoch = 0, .position = 3, .datasetSize = 24}),
                    Catch::Contains("dataset of 24 samples, this one has 25"));
}

namespace {

// One segment of training: `steps` steps of `batch` indices on each of `world` ranks, starting
// from `from` (a state saved by an earlier segment, possibly at another world size). Returns what
// every rank took, by global position, and the state a checkpoint would save afterwards.
struct Segment {
  std::map<size_t, size_t> byPosition;  // global position -> sample index
  SamplerState after;
};
Segment runSegment(DistributedSamplerOptions o, const SamplerState& from, int world, int steps,
                   size_t batch) {
  Segment seg;
  o.numReplicas = world;
  for (int r = 0; r < world; ++r) {
    o.rank = r;
    DistributedSampler s(o);
    s.restore(from);
    for (int k = 0; k < steps; ++k) {
      auto b = s.next(batch);
      REQUIRE(b);
      REQUIRE(b->size() == batch);
      for (size_t j = 0; j < b->size(); ++j) {
        const size_t position = from.position + (static_cast<size_t>(k) * batch + j) * world + r;
        CHECK(seg.byPosition.emplace(position, (*b)[j]).second);
      }
    }
    if (r == 0) seg.after = s.state();
  }
  return seg;
}

}  // namespace

TEST_CASE("a position saved at one world size resumes at any other: every sample once",
          "[sampler]") {
  // Sequences of (world size, steps) within one epoch, as shrinks and grows of an elastic job;
  // the last segment runs to the end of the epoch.
  const std::vector<std::vector<int>> sequences = {
      {1, 2, 1}, {2, 3, 2}, {4, 1, 3, 2, 4}, {3, 3, 1}, {2, 7, 5, 1}};
  for (bool dropLast : {true, false}) {
    for (const auto& worlds : sequences) {
      const size_t n = 1009, batch = 4;
      DistributedSamplerOptions o{.datasetSize = n, .shuffle = true, .seed = 5, .dropLast = dropLast};
      SamplerState at{.epoch = 3, .position = 0, .datasetSize = n};
      std::map<size_t, size_t> taken;
      for (size_t i = 0; i < worlds.size(); ++i) {
        const int w = worlds[i];
        DistributedSampler probe({.datasetSize = n, .numReplicas = w, .rank = 0, .seed = 5,
                                  .dropLast = dropLast});
        probe.restore(at);
        const int all = static_cast<int>(probe.size() / batch);
        const int steps = i + 1 == worlds.size() ? all : std::min(all, 7 + 3 * static_cast<int>(i));
        Segment seg = runSegment(o, at, w, steps, batch);
        for (const auto& [pos, idx] : seg.byPosition) CHECK(taken.emplace(pos, idx).second);
        CHECK(seg.after.epoch == 3);
        CHECK(seg.after.position == std::min(n, at.position + static_cast<size_t>(steps) * batch * w));
        at = seg.after;
      }
      INFO("worlds " << worlds.size() << " dropLast " << dropLast);
      // The positions taken are a prefix of the epoch (plus padding past its end), and the
      // samples at positions < n are the epoch's order itself: each sample at most once.
      const auto perm = torch::randperm(static_cast<int64_t>(n),
                                        at::detail::createCPUGenerator(5 + 3), torch::kLong);
      std::set<size_t> seen;
      size_t expected = 0;
      for (const auto& [pos, idx] : taken) {
        CHECK(pos == expected++);
        if (pos < n) {
          CHECK(idx == static_cast<size_t>(perm[static_cast<int64_t>(pos)].item<int64_t>()));
          CHECK(seen.insert(idx).second);
        } else {
          CHECK(!dropLast);  // only padding lies beyond the epoch
        }
      }
      // What was not taken is the tail: less than one global batch of the last world size.
      const size_t last = static_cast<size_t>(worlds.back()) * batch;
      CHECK(n - seen.size() < last);
    }
  }
}

TEST_CASE("resuming at the same world size continues the uninterrupted epoch index for index",
          "[sampler]") {
  for (bool dropLast : {true, false}) {
    for (int w : {1, 2, 3, 4}) {
      DistributedSamplerOptions o{.datasetSize = 1001, .numReplicas = w, .seed = 9,
                                  .dropLast = dropLast};
      for (int r = 0; r < w; ++r) {
        o.rank = r;
        DistributedSampler whole(o);
        whole.setEpoch(2);
        DistributedSampler first(o);
        first.setEpoch(2);
        first.next(37);
        DistributedSampler resumed(o);
        resumed.restore(first.state());
        const std::vector<size_t> rest(whole.indices().begin() + 37, whole.indices().end());
        INFO("world " << w << " rank " << r << " dropLast " << dropLast);
        CHECK(resumed.indices() == rest);
      }
    }
  }
}

TEST_CASE("bad sampler options name the value", "[sampler]") {
  CHECK_THROWS_WITH(DistributedSampler({.datasetSize = 5, .numReplicas = 0}),
                    Catch::Contains("numReplicas=0"));
  CHECK_THROWS_WITH(DistributedSampler({.datasetSize = 5, .numReplicas = 2, .rank = 2}),
                    Catch::Contains("rank=2"));
}
