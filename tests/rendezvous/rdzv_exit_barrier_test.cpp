// The slot join's exit barrier on a spilled log (DynamicRendezvous::finishBySlots: markDone,
// markFinishing, finishFromCount, then every node reads the versions up to Finished), each node
// with its own counted client: what one node costs the store, at 8 and at 256 nodes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "rendezvous/counting_store.h"
#include "rendezvous/memory_store.h"
#include "rendezvous/scalable/slot_join.h"
#include "rendezvous/state_log.h"

using namespace ddprun;
using namespace ddprun::rendezvous;

namespace {

struct Barrier {
  StoreTraffic::Snapshot maxCost;  // over every node: round trips and bytes (each its maximum)
  StoreTraffic::Snapshot medianCost;
  Versioned end;                   // the final version, compact, as a node read it
  RoundState loaded;               // the same, its lists loaded
  std::vector<NodeInfo> members;
};

// n nodes form a closed round with spilled lists; then `lost` of them (the last ones) are
// removed in the exit barrier (evicted: transition::remove marks them lost) after the first
// node is done, and the others finish in turn, as finishBySlots does.
Barrier exitBarrier(int n, int lost = 0) {
  auto store = std::make_shared<MemoryStore>();
  const JobLimits lim{.minNodes = n, .maxNodes = n, .maxRestarts = 3};
  StateLog setup(*store, lim, /*spill=*/true);
  Versioned v = setup.latest();
  for (int i = 0; i < n; ++i) {
    NodeInfo me{.id = "n" + std::to_string(i), .addr = "10.0.0." + std::to_string(i % 250 + 1)};
    v = setup.update(v, [&](const RoundState& s) { return transition::join(s, me, lim); }).now;
  }
  REQUIRE(v.state.phase == Phase::Closed);
  Barrier out;
  out.members = v.state.members;
  const int64_t round = v.state.round;
  const Versioned closed = StateLog(*store, lim).read(v.version);
  REQUIRE(closed.state.compact());

  std::vector<std::shared_ptr<StoreTraffic>> traffic;
  std::vector<std::unique_ptr<CountingStore>> stores;
  std::vector<std::unique_ptr<StateLog>> logs;
  std::vector<Versioned> known;
  for (int i = 0; i < n; ++i) {
    traffic.push_back(std::make_shared<StoreTraffic>());
    stores.push_back(std::make_unique<CountingStore>(store, traffic.back()));
    logs.push_back(std::make_unique<StateLog>(*stores.back(), lim, /*spill=*/true));
    known.push_back(closed);
  }
  const int finishing = n - lost;
  for (int i = 0; i < finishing; ++i) {
    StateLog& log = *logs[i];
    const int64_t d = scalable::markDone(*stores[i], round, out.members[i].id);
    CHECK(d == i + 1);
    if (d == 1) {
      known[i] = markFinishing(log, known[i], round, out.members[i].id).now;
      CHECK(known[i].state.finishing());
      for (int l = finishing; l < n; ++l) {  // the lost ones, evicted by a watcher (not counted)
        StateLog evictor(*store, lim, /*spill=*/true);
        const auto r = removeNode(evictor, evictor.refresh(closed), out.members[l].id, "evicted");
        CHECK(r.wrote);
      }
    }
    const RoundState& s = known[i].state;
    if (d + static_cast<int64_t>(s.lost.size()) >= n || (lost > 0 && d == finishing)) {
      known[i] = finishFromCount(log, known[i], round, d, [&] {
        return scalable::readDone(*stores[i], round, d, Millis(1'000));
      }).now;
    }
  }
  // Every node in the barrier reads the versions after the one it knows, up to the final one.
  for (int i = 0; i < finishing; ++i) {
    while (!known[i].state.ended()) {
      auto next = logs[i]->waitNewer(known[i], Millis(1'000));
      REQUIRE(next);
      known[i] = *next;
    }
  }
  std::vector<StoreTraffic::Snapshot> costs;
  for (int i = 0; i < finishing; ++i) costs.push_back(traffic[i]->snapshot());
  auto by = [&](auto field) {
    std::vector<int64_t> v;
    for (const auto& c : costs) v.push_back(c.*field);
    std::sort(v.begin(), v.end());
    return std::make_pair(v[v.size() / 2], v.back());
  };
  const auto rt = by(&StoreTraffic::Snapshot::roundTrips), b = by(&StoreTraffic::Snapshot::bytes);
  out.medianCost = {rt.first, b.first};
  out.maxCost = {rt.second, b.second};
  StateLog reader(*store, lim);
  out.end = reader.refresh(closed);
  out.loaded = out.end.state;
  reader.hydrate(out.loaded);
  return out;
}

}  // namespace

TEST_CASE("the exit barrier: every node's store work is the same at 8 and 256 nodes, the final "
          "version names no done id, and loads as finishWithDone's state",
          "[rdzv][log]") {
  const Barrier small = exitBarrier(8), large = exitBarrier(256);
  INFO("round trips median/max " << small.medianCost.roundTrips << "/" << small.maxCost.roundTrips
       << " at 8, " << large.medianCost.roundTrips << "/" << large.maxCost.roundTrips
       << " at 256; bytes " << small.medianCost.bytes << "/" << small.maxCost.bytes << " at 8, "
       << large.medianCost.bytes << "/" << large.maxCost.bytes << " at 256");
  std::printf("exit barrier per node: round trips median/max %lld/%lld at 8, %lld/%lld at 256; "
              "bytes %lld/%lld at 8, %lld/%lld at 256\n",
              (long long)small.medianCost.roundTrips, (long long)small.maxCost.roundTrips,
              (long long)large.medianCost.roundTrips, (long long)large.maxCost.roundTrips,
              (long long)small.medianCost.bytes, (long long)small.maxCost.bytes,
              (long long)large.medianCost.bytes, (long long)large.maxCost.bytes);
  CHECK(large.maxCost.roundTrips == small.maxCost.roundTrips);
  CHECK(large.medianCost.roundTrips == small.medianCost.roundTrips);
  CHECK(large.maxCost.roundTrips <= 10);
  CHECK(large.maxCost.bytes < small.maxCost.bytes + 256);  // the digits of larger ids and counts
  CHECK(large.maxCost.bytes < 4096);
  for (const Barrier* b : {&small, &large}) {
    const RoundState& end = b->end.state;
    CHECK(end.phase == Phase::Finished);
    CHECK(end.allDone);
    CHECK(end.done.empty());
    CHECK(end.reason == "every node's workers succeeded in round 0");
    // Loaded: every member done, as transition::finishWithDone gives it.
    std::vector<std::string> ids;
    for (const auto& m : b->members) ids.push_back(m.id);
    std::vector<std::string> done = b->loaded.done;
    CHECK(std::set<std::string>(done.begin(), done.end()) ==
          std::set<std::string>(ids.begin(), ids.end()));
    CHECK_FALSE(b->loaded.allDone);
    CHECK(b->loaded.members == b->members);
    CHECK(decodeState(encodeState(end), "k") == end);
  }
}

TEST_CASE("the exit barrier with a member lost: the done ids tell the done from the lost, and "
          "the final version still names no done id",
          "[rdzv][log]") {
  const Barrier b = exitBarrier(6, 2);
  const RoundState& end = b.end.state;
  CHECK(end.phase == Phase::Finished);
  CHECK(end.allDone);
  CHECK(end.lost == std::vector<std::string>{"n4", "n5"});
  CHECK(end.reason.find("2 node(s) were lost in the exit barrier") != std::string::npos);
  CHECK(b.loaded.done == std::vector<std::string>{"n0", "n1", "n2", "n3"});
  CHECK(b.loaded.lost == std::vector<std::string>{"n4", "n5"});
}

TEST_CASE("a done-all record is only valid in a finished state with its members in the store",
          "[rdzv][log]") {
  RoundState s;
  s.round = 2;
  s.phase = Phase::Finished;
  s.membersList = ListRef{.ref = 5, .count = 3};
  s.worldSize = 3;
  s.masterAddr = "10.0.0.1";
  s.masterPort = 29500;
  s.allDone = true;
  CHECK(decodeState(encodeState(s), "k") == s);
  RoundState closed = s;
  closed.phase = Phase::Closed;
  CHECK_THROWS_WITH(decodeState(encodeState(closed), "k"), Catch::Contains("done-all"));
  RoundState inline_ = s;
  inline_.membersList = {};
  inline_.members = {NodeInfo{.id = "a", .addr = "10.0.0.1", .nproc = 1}};
  CHECK_THROWS_WITH(decodeState(encodeState(inline_), "k"), Catch::Contains("done-all"));
  RoundState both = s;
  both.done = {"a"};
  CHECK_THROWS_WITH(decodeState(encodeState(both), "k"), Catch::Contains("done-all"));
}
