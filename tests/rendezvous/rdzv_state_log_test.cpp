// The versioned state log: compare-set appends under contention, markers, the hint.
#include <catch2/catch.hpp>

#include <thread>

#include "rendezvous/counting_store.h"
#include "rendezvous/memory_store.h"
#include "rendezvous/scalable/waiting_list.h"
#include "rendezvous/state_log.h"

using namespace ddprun;
using namespace ddprun::rendezvous;

namespace {

// Nodes n0 .. n<count - 1> (addresses 10.0.0.1, .2, ...; the 251st is .1 again) join one after
// another through `log`; the last version written (closed when `count` fills the round).
Versioned joinNodes(StateLog& log, const JobLimits& lim, int count) {
  Versioned v = log.latest();
  for (int i = 0; i < count; ++i) {
    NodeInfo me{.id = "n" + std::to_string(i), .addr = "10.0.0." + std::to_string(i % 250 + 1)};
    v = log.update(v, [&](const RoundState& s) { return transition::join(s, me, lim); }).now;
  }
  return v;
}

// `s` with its lists loaded by `reader`.
RoundState hydrated(StateLog& reader, RoundState s) {
  reader.hydrate(s);
  return s;
}

// `s` written as version `version` of the store (as anyone with access to it could), read back by
// `reader` (unloaded: hydrate() is what checks the lists it names).
RoundState writeAndRead(MemoryStore& store, StateLog& reader, int64_t version, const RoundState& s) {
  store.set(stateKey(version), encodeState(s));
  return reader.read(version).state;
}

}  // namespace

TEST_CASE("16 threads join through one log: every join lands exactly once", "[rdzv][log]") {
  auto store = std::make_shared<MemoryStore>();
  const JobLimits lim{.minNodes = 16, .maxNodes = 16};
  std::vector<std::thread> threads;
  std::vector<int> wrote(16, 0);
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      StateLog log(*store, lim);
      NodeInfo me{.id = "n" + std::to_string(i), .addr = "10.0.0." + std::to_string(i + 1)};
      auto r = log.update(log.latest(), [&](const RoundState& s) {
        return transition::join(s, me, lim);
      });
      wrote[i] = r.wrote;
    });
  }
  for (auto& t : threads) t.join();
  for (int w : wrote) CHECK(w == 1);

  StateLog log(*store, lim);
  Versioned last = log.refresh(log.latest());
  CHECK(last.version == 16);  // one version per join, no gaps, nothing lost
  CHECK(last.state.phase == Phase::Closed);
  REQUIRE(last.state.members.size() == 16);
  CHECK(last.state.members[0].addr == "10.0.0.1");
  CHECK(last.state.members[15].addr == "10.0.0.16");
  for (int64_t v = 1; v <= 16; ++v) CHECK(log.read(v).state.round == 0);
  // The markers name a version that implies them.
  CHECK(log.waitMarker(closedKey(0), Millis(0)) == std::optional<int64_t>(16));
  auto lc = log.waitMarker(lastCallKey(0), Millis(0));
  REQUIRE(lc);
  CHECK(*lc == 16);
  CHECK_FALSE(log.waitMarker(overKey(0), Millis(0)).has_value());
}

TEST_CASE("two nodes recovering in process from the same version spend two restarts",
          "[rdzv][log]") {
  auto store = std::make_shared<MemoryStore>();
  const JobLimits lim{.minNodes = 2, .maxNodes = 2, .maxRestarts = 2};
  StateLog a(*store, lim), b(*store, lim);
  NodeInfo x{.id = "x", .addr = "x"}, y{.id = "y", .addr = "y"};
  a.update(a.latest(), [&](const RoundState& s) { return transition::join(s, x, lim); });
  const Versioned closed = b.update(b.latest(), [&](const RoundState& s) {
    return transition::join(s, y, lim);
  }).now;
  REQUIRE(closed.state.phase == Phase::Closed);
  // Both start from the closed version, as two agents whose workers died at once.
  auto rx = a.update(closed, [&](const RoundState& s) {
    return transition::recoverWorkers(s, 0, "x", 9, "rank 1 died", lim);
  });
  auto ry = b.update(closed, [&](const RoundState& s) {
    return transition::recoverWorkers(s, 0, "y", 9, "rank 2 died", lim);
  });
  CHECK(rx.wrote);
  CHECK(ry.wrote);
  CHECK(rx.now.state.restarts == 1);
  CHECK(ry.now.state.restarts == 2);
  CHECK(ry.now.version == closed.version + 2);
  CHECK(ry.now.state.round == 0);
}

TEST_CASE("a no-op transition is only accepted on the newest version", "[rdzv][log]") {
  auto store = std::make_shared<MemoryStore>();
  const JobLimits lim{.minNodes = 1, .maxNodes = 4};
  StateLog a(*store, lim), b(*store, lim);
  NodeInfo x{.id = "x", .addr = "x"}, y{.id = "y", .addr = "y"};
  auto joinX = [&](const RoundState& s) { return transition::join(s, x, lim); };
  Versioned v1 = a.update(a.latest(), joinX).now;
  Versioned v2 = b.update(b.latest(), [&](const RoundState& s) {
    return transition::join(s, y, lim);
  }).now;
  CHECK(v2.version == 2);
  // `a` still holds version 1; joining again is a no-op, answered on version 2.
  auto r = a.update(v1, joinX);
  CHECK_FALSE(r.wrote);
  CHECK(r.now.version == 2);
  CHECK(r.now.state.members.size() == 2);
}

TEST_CASE("waitNewer wakes on the next version and times out without one", "[rdzv][log]") {
  auto store = std::make_shared<MemoryStore>();
  const JobLimits lim{.minNodes = 1, .maxNodes = 2};
  StateLog log(*store, lim);
  Versioned v0 = log.latest();
  CHECK_FALSE(log.waitNewer(v0, Millis(20)).has_value());
  std::thread writer([&] {
    StateLog w(*store, lim);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    w.update(w.latest(), [&](const RoundState& s) {
      return transition::join(s, NodeInfo{.id = "w", .addr = "w"}, lim);
    });
  });
  auto v1 = log.waitNewer(v0, Millis(5000));
  writer.join();
  REQUIRE(v1);
  CHECK(v1->version == 1);
  CHECK(v1->state.members.size() == 1);
}

TEST_CASE("a state key holding garbage is reported, not trusted", "[rdzv][log]") {
  auto store = std::make_shared<MemoryStore>();
  store->set("latest", "1");
  store->set("state/1", "not a state");
  StateLog log(*store, JobLimits{});
  CHECK_THROWS_WITH(log.latest(), Catch::Contains("'state/1' is corrupt or forged"));
  store->set("latest", "x1");
  CHECK_THROWS_WITH(log.latest(), Catch::Contains("not a state version"));
}

TEST_CASE("a forged state is refused field by field, a forged hint at once", "[rdzv][log]") {
  const JobLimits lim{.minNodes = 1, .maxNodes = 2, .maxRestarts = 1};
  auto forged = [&](const std::string& records) {
    auto store = std::make_shared<MemoryStore>();
    store->set("latest", "1");
    store->set("state/1", "ddprun-rendezvous-state 1\nround 1\nphase closed\nrestarts 0\nexit 0\n"
                          "reason r\n" + records);
    StateLog log(*store, lim);
    try {
      log.latest();
    } catch (const StoreError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string ok = "member a 127.0.0.2 2 29500 -1 -1\n";
  CHECK(forged(ok) == "accepted");
  CHECK(forged(ok + "member b 127.0.0.3 2 29500 -1 -1\nmember c 127.0.0.4 2 29500 -1 -1\n")
            .find("3 members, more than MAX=2") != std::string::npos);
  CHECK(forged("member a 127.0.0.2 2147483647 29500 -1 -1\n").find("corrupt or forged") !=
        std::string::npos);  // an nproc that would overflow the world size
  CHECK(forged("member a 127.0.0.2;rm 2 29500 -1 -1\n").find("node record") != std::string::npos);
  CHECK(forged("member a 127.0.0.2 2 29500 -7 -1\n").find("node record") != std::string::npos);
  CHECK(forged("member a 127.0.0.2 2 29500 5 -1\n").find("node rank 5 >= MAX=2") !=
        std::string::npos);
  CHECK(forged(ok + ok).find("a member appears twice") != std::string::npos);
  CHECK(forged("").find("closed with no member") != std::string::npos);

  // A hint naming a version nobody wrote: reported at once instead of waiting for it.
  auto store = std::make_shared<MemoryStore>();
  store->set("latest", "7");
  StateLog log(*store, lim);
  CHECK_THROWS_WITH(log.latest(), Catch::Contains("names version 7, which was never written"));
}

TEST_CASE("spilled lists: a version names the member list, readers get their own entry",
          "[rdzv][log]") {
  auto store = std::make_shared<MemoryStore>();
  const JobLimits lim{.minNodes = 8, .maxNodes = 8};
  StateLog log(*store, lim, /*spill=*/true);
  Versioned v = log.latest();
  for (int i = 0; i < 8; ++i) {
    NodeInfo me{.id = "n" + std::to_string(i), .addr = "10.0.0." + std::to_string(i + 1),
                .nproc = i + 1, .masterPort = static_cast<uint16_t>(1000 + i)};
    v = log.update(v, [&](const RoundState& s) { return transition::join(s, me, lim); }).now;
  }
  REQUIRE(v.state.phase == Phase::Closed);
  REQUIRE(v.state.members.size() == 8);  // the writer holds the whole state
  const std::vector<NodeInfo> full = v.state.members;
  // A reader gets the compact version: no member lines, the count, world size and master.
  StateLog reader(*store, lim);
  Versioned c = reader.read(v.version);
  CHECK(c.state.compact());
  CHECK(c.state.members.empty());
  CHECK(c.state.memberCount() == 8);
  CHECK(c.state.worldSize == 36);
  CHECK(c.state.masterAddr == full[0].addr);
  CHECK(c.state.masterPort == full[0].masterPort);
  CHECK(store->get(stateKey(v.version)).find("member ") == std::string::npos);
  // Each member's own entry: its node rank and first global rank; a stranger has none.
  int offset = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    auto p = position(*store, c.state, RoundState::List::Members, full[i].id);
    REQUIRE(p);
    CHECK(p->index == static_cast<int64_t>(i));
    CHECK(p->rankOffset == offset);
    offset += full[i].nproc;
    // The heartbeat ring: the next member by node rank, the same on the loaded state.
    CHECK(ringTarget(*store, c.state, full[i].id) == full[(i + 1) % full.size()].id);
    CHECK(ringTarget(*store, v.state, full[i].id) == full[(i + 1) % full.size()].id);
  }
  CHECK_FALSE(position(*store, c.state, RoundState::List::Members, "stranger"));
  CHECK(ringTarget(*store, c.state, "stranger") == "");
  {
    // Members lost in process are watched no more: the ring skips them (two in a row too), and
    // a lost node watches nobody; the same on the compact and the loaded state.
    RoundState cl = c.state, vl = v.state;
    cl.lost = vl.lost = {full[3].id, full[4].id};
    CHECK(ringTarget(*store, cl, full[2].id) == full[5].id);
    CHECK(ringTarget(*store, vl, full[2].id) == full[5].id);
    CHECK(ringTarget(*store, cl, full[1].id) == full[2].id);
    CHECK(ringTarget(*store, cl, full[3].id) == "");
    CHECK(ringTarget(*store, vl, full[4].id) == "");
  }
  {
    // With a ListCache (the entries an agent read or wrote: StateView::lists()) the ring
    // re-targets without reading them again. The eviction's version (round r+1 awaits round r's
    // members without one) names the same list: only a new successor's entry is read.
    auto traffic = std::make_shared<StoreTraffic>();
    CountingStore counted(store, traffic);
    ListCache cache;
    CHECK(ringTarget(counted, c.state, full[2].id, &cache) == full[3].id);
    CHECK(traffic->roundTrips == 2);  // its position and its successor's entry
    CHECK(ringTarget(counted, c.state, full[2].id, &cache) == full[3].id);
    CHECK(traffic->roundTrips == 2);
    RoundState evicted;
    evicted.round = c.state.round + 1;
    evicted.phase = Phase::Joining;
    evicted.expectedList = ListRef{.ref = c.state.membersList.ref, .count = 7, .ofMembers = true,
                                   .without = full[3].id};
    CHECK(ringTarget(counted, evicted, full[2].id, &cache) == full[4].id);
    CHECK(traffic->roundTrips == 3);  // entry 4 only
    CHECK(ringTarget(*store, evicted, full[2].id) == full[4].id);  // as without a cache
    // A position the agent wrote itself (its slot's entry, noted by DynamicRendezvous) is not read.
    cache.notePosition(c.state.membersList.ref, full[6].id, {.index = 6, .rankOffset = 21});
    CHECK(ringTarget(counted, c.state, full[6].id, &cache) == full[7].id);
    CHECK(traffic->roundTrips == 4);
  }
  // Loading the lists gives the state back.
  CHECK(hydrated(reader, c.state) == v.state);
  // The job is full: a ninth node waits, on a spilled waiting list (the members keep their list).
  const NodeInfo ninth{.id = "n8", .addr = "10.0.0.9"};
  Versioned w = log.update(c, [&](const RoundState& s) {
    return transition::arrive(s, ninth, lim);
  }).now;
  Versioned wc = reader.read(w.version);
  CHECK(wc.state.waiting.empty());
  CHECK(wc.state.waitingList.count == 1);
  CHECK(wc.state.membersList == c.state.membersList);
  CHECK(position(*store, wc.state, RoundState::List::Waiting, "n8"));
  CHECK_FALSE(position(*store, wc.state, RoundState::List::Waiting, full[0].id));
  CHECK(store->get(stateKey(w.version)).find("waiting ") == std::string::npos);
  c = wc;
  // A transition that leaves the members alone keeps the list's ref (nothing rewritten).
  const int64_t lists = store->add("lists", 0);
  Versioned d = log.update(c, [&](const RoundState& s) {
    return transition::nodeDone(s, s.round, full[3].id);
  }).now;
  CHECK(store->add("lists", 0) == lists);
  CHECK(reader.read(d.version).state.membersList == c.state.membersList);
  // A member leaving: the next round expects the other seven, a new list.
  Versioned e = log.update(reader.read(d.version), [&](const RoundState& s) {
    return transition::remove(s, full[5].id, "left", lim);
  }).now;
  (void)e;
}

TEST_CASE("a version naming a list that was never written, or another list, is refused",
          "[rdzv][log]") {
  auto store = std::make_shared<MemoryStore>();
  const JobLimits lim{.minNodes = 1, .maxNodes = 1};
  StateLog log(*store, lim, /*spill=*/true);
  Versioned v = log.update(log.latest(), [&](const RoundState& s) {
    return transition::join(s, NodeInfo{.id = "a", .addr = "10.0.0.1", .nproc = 2}, lim);
  }).now;
  REQUIRE(v.state.phase == Phase::Closed);
  const std::string text = store->get(stateKey(v.version));
  // The next version, forged: names list 99 (never written).
  std::string forged = text;
  const size_t at = forged.find("members-list ");
  REQUIRE(at != std::string::npos);
  forged = forged.substr(0, at) + "members-list 99 1 2 10.0.0.1 0\n";
  store->set(stateKey(v.version + 1), forged);
  Versioned f = log.read(v.version + 1);  // the version itself is well-formed
  CHECK_THROWS_WITH(log.hydrate(f.state), Catch::Contains("l/99/0") && Catch::Contains("forged"));
  // Names the real list with another world size: refused too.
  const std::string real = text.substr(at);
  const auto w = real.substr(13, real.find(' ', 13) - 13);
  store->set(stateKey(v.version + 2),
             text.substr(0, at) + "members-list " + w + " 1 3 10.0.0.1 0\n");
  Versioned g = log.read(v.version + 2);
  CHECK_THROWS_WITH(log.hydrate(g.state), Catch::Contains("world size"));
  // And a record that is not a state's line.
  CHECK_THROWS_AS(decodeNodeLines({"member a"}, RoundState::List::Members, "'l/1'"), StoreError);
  CHECK_THROWS_AS(decodeNodeLines({"expected a 0"}, RoundState::List::Members, "'l/1'"), StoreError);
}

TEST_CASE("spilled lists: a restart expects the member list back without writing a new one",
          "[rdzv][log]") {
  auto store = std::make_shared<MemoryStore>();
  const JobLimits lim{.minNodes = 4, .maxNodes = 4, .maxRestarts = 2};
  StateLog log(*store, lim, /*spill=*/true);
  Versioned v = joinNodes(log, lim, 4);
  REQUIRE(v.state.phase == Phase::Closed);
  const std::vector<NodeInfo> members = v.state.members;
  StateLog reader(*store, lim);
  const Versioned closed = reader.read(v.version);
  const int64_t lists = store->add("lists", 0);
  Versioned f = log.update(closed, [&](const RoundState& s) {
    return transition::failWorkers(s, s.round, "n2", 1, "boom", lim);
  }).now;
  REQUIRE(f.state.phase == Phase::Joining);
  CHECK(store->add("lists", 0) == lists);  // nothing written but the version
  const Versioned joining = reader.read(f.version);
  CHECK(joining.state.expectedList.ref == closed.state.membersList.ref);
  CHECK(joining.state.expectedList.ofMembers);
  CHECK(joining.state.expectedCount() == 4);
  CHECK(slotTarget(joining.state, lim) == 4);
  CHECK(store->get(stateKey(f.version)).find("expected-list") != std::string::npos);
  // Loaded, it is the state the transition made: each member expected with its node rank.
  const RoundState h = hydrated(reader, joining.state);
  CHECK(h == f.state);
  REQUIRE(h.expected.size() == 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(h.expected[i].id == members[i].id);
    CHECK(h.expected[i].prevRank == i);
  }
  // The ring while it is joining: the expected nodes in that order.
  for (int i = 0; i < 4; ++i) {
    CHECK(ringTarget(*store, joining.state, members[i].id) == members[(i + 1) % 4].id);
    const auto p = position(*store, joining.state, RoundState::List::Expected, members[i].id);
    REQUIRE(p);
    CHECK(p->index == i);
  }
}

// Issue 20 (and 18's recovery path): a recovery in process and a failure report whose round
// another node's report already ended cost their writer O(1) store work, whatever N: neither
// loads a list (before, both went through update(), which loads every list of the state).
TEST_CASE("spilled lists: an in-process recovery and a failure report of a round already over "
          "load no list (the same store work at 8 and 256 nodes)",
          "[rdzv][log]") {
  std::vector<StoreTraffic::Snapshot> recovery, moot;
  for (const int n : {8, 256}) {
    auto store = std::make_shared<MemoryStore>();
    const JobLimits lim{.minNodes = n, .maxNodes = n, .maxRestarts = 3};
    StateLog log(*store, lim, /*spill=*/true);
    Versioned v = joinNodes(log, lim, n);
    REQUIRE(v.state.phase == Phase::Closed);
    const RoundState full = v.state;  // loaded: the closer's
    const int64_t round = full.round;
    auto traffic = std::make_shared<StoreTraffic>();
    CountingStore counted(store, traffic);
    StateLog a(counted, lim, /*spill=*/true);
    const Versioned closed = a.read(v.version);
    REQUIRE(closed.state.compact());

    auto t0 = traffic->snapshot();
    const auto r = recoverNode(a, closed, round, full.members.back().id, 9, "rank died", false);
    recovery.push_back(traffic->snapshot() - t0);
    REQUIRE(r.wrote);
    CHECK(r.now.state.round == round);
    CHECK(r.now.state.phase == Phase::Closed);
    CHECK(r.now.state.restarts == 1);
    // Loaded, the version is transition::recoverWorkers's state.
    StateLog reader(*store, lim);
    RoundState h = reader.read(r.now.version).state;
    reader.hydrate(h);
    const auto expect =
        transition::recoverWorkers(full, round, full.members.back().id, 9, "rank died", lim);
    REQUIRE(expect);
    CHECK(h == *expect);

    // Two nodes report a failure from that version: the first ends the round, the second finds
    // it over and writes nothing.
    StateLog b(*store, lim, /*spill=*/true);
    const auto f = failNode(b, r.now, round, full.members[0].id, 1, "boom", false);
    REQUIRE(f.wrote);
    CHECK(f.now.state.phase == Phase::Joining);
    t0 = traffic->snapshot();
    const auto m = failNode(a, r.now, round, full.members[1].id, 1, "boom too", false);
    moot.push_back(traffic->snapshot() - t0);
    CHECK_FALSE(m.wrote);
    CHECK(m.now.version == f.now.version);
    CHECK(m.now.state.restarts == 2);
    // And a recovery reported late, into the next round, writes nothing either.
    t0 = traffic->snapshot();
    const auto late = recoverNode(a, r.now, round, full.members[2].id, 9, "late", false);
    CHECK_FALSE(late.wrote);
    CHECK(late.now.version == f.now.version);
    CHECK(traffic->snapshot().roundTrips - t0.roundTrips <= moot.back().roundTrips);
  }
  for (const auto* t : {&recovery, &moot}) {
    INFO((t == &recovery ? "recovery" : "moot failure") << ": round trips "
         << (*t)[0].roundTrips << " / " << (*t)[1].roundTrips << ", bytes " << (*t)[0].bytes
         << " / " << (*t)[1].bytes << " at 8 / 256 nodes");
    CHECK((*t)[1].roundTrips == (*t)[0].roundTrips);
    CHECK((*t)[1].roundTrips <= 4);
    CHECK((*t)[1].bytes < (*t)[0].bytes + 256);
    CHECK((*t)[1].bytes < 4096);
  }
}

TEST_CASE("spilled lists: an eviction from a closed round writes no list (the member list "
          "without the evicted node), and loads as transition::remove's state",
          "[rdzv][log]") {
  auto store = std::make_shared<MemoryStore>();
  const JobLimits lim{.minNodes = 2, .maxNodes = 4, .maxRestarts = 2};
  StateLog log(*store, lim, /*spill=*/true);
  Versioned v = joinNodes(log, lim, 4);
  REQUIRE(v.state.phase == Phase::Closed);
  const std::vector<NodeInfo> members = v.state.members;
  const std::optional<RoundState> expect = transition::remove(v.state, "n1", "gone", lim);
  REQUIRE(expect);
  StateLog reader(*store, lim);
  const int64_t lists = store->add("lists", 0);
  const int64_t keys = store->numKeys();
  // removeNode re-reads a loaded state in its compact form (one read).
  const Versioned e = removeNode(log, v, "n1", "gone").now;
  CHECK(store->add("lists", 0) == lists);
  // The version and the markers of round 2 (over/<1>): no list entry.
  CHECK(store->numKeys() <= keys + 3);
  const Versioned joining = reader.read(e.version);
  REQUIRE(joining.state.phase == Phase::Joining);
  CHECK(joining.state.expectedList.ofMembers);
  CHECK(joining.state.expectedList.without == "n1");
  CHECK(joining.state.expectedCount() == 3);
  CHECK(slotTarget(joining.state, lim) == 3);
  CHECK(store->get(stateKey(e.version)).find("expected-list") != std::string::npos);
  CHECK(hydrated(reader, joining.state) == *expect);
  // The ring and positions skip the evicted node.
  CHECK_FALSE(position(*store, joining.state, RoundState::List::Expected, "n1"));
  CHECK(ringTarget(*store, joining.state, "n0") == "n2");
  CHECK(ringTarget(*store, joining.state, "n3") == "n0");
  CHECK(ringTarget(*store, joining.state, "n1") == "");
  // It round-trips through the codec, and a forged `without` (not in the list) is refused.
  CHECK(decodeState(encodeState(joining.state), "k") == joining.state);
  RoundState forged = joining.state;
  forged.expectedList.without = "zz";
  RoundState g = writeAndRead(*store, reader, e.version + 1, forged);
  CHECK_THROWS_WITH(reader.hydrate(g), Catch::Contains("leaves out"));
}

// Issue 20: a full round's waiting list by counters (scalable/waiting_list.h). The waiting nodes
// write no version; the eviction's re-form names them after the members (ListRef::waiting) and
// loads as transition::remove's state would have with the same waiting list in the version.
TEST_CASE("spilled lists: a full round's waiting list by counters writes no version, and the "
          "eviction's re-form expects the waiting nodes after the members",
          "[rdzv][log]") {
  auto store = std::make_shared<MemoryStore>();
  const JobLimits lim{.minNodes = 2, .maxNodes = 4, .maxRestarts = 2};
  StateLog log(*store, lim, /*spill=*/true);
  Versioned v = joinNodes(log, lim, 4);
  REQUIRE(v.state.phase == Phase::Closed);
  const int64_t r = v.state.round;
  const NodeInfo n8{.id = "n8", .addr = "10.0.0.8", .nproc = 2}, n9{.id = "n9", .addr = "10.0.0.9"};
  CHECK(scalable::readWaitingCount(*store, r) == 0);
  CHECK(scalable::joinWaitingList(*store, r, n8) == 1);
  CHECK(scalable::joinWaitingList(*store, r, n9) == 2);
  CHECK_FALSE(store->check({stateKey(v.version + 1)}));  // no version written
  CHECK(scalable::readWaitingCount(*store, r) == 2);
  // An entry in flight (its index taken, its entries not yet written) makes the count 0: the
  // waiting nodes then re-join as newcomers.
  store->add(scalable::waitingCountKey(r), 1);
  CHECK(scalable::readWaitingCount(*store, r) == 0);
  store->add(scalable::waitingWrittenKey(r), 1);  // (as if its holder wrote it)
  store->set(listKey(waitingListRef(r), 2), encodeNodeLine(NodeInfo{.id = "n7", .addr = "10.0.0.7"},
                                                         RoundState::List::Waiting));
  store->set(listIdKey(waitingListRef(r), "n7"), "2 0");
  RoundState withWaiting = v.state;
  withWaiting.waiting = {n8, n9, NodeInfo{.id = "n7", .addr = "10.0.0.7"}};
  const std::optional<RoundState> expect = transition::remove(withWaiting, "n1", "gone", lim);
  REQUIRE(expect);
  StateLog reader(*store, lim);
  const Versioned e = removeNode(log, v, "n1", "gone").now;
  const Versioned joining = reader.read(e.version);
  REQUIRE(joining.state.phase == Phase::Joining);
  CHECK(joining.state.expectedList.without == "n1");
  CHECK(joining.state.expectedList.waiting == 3);
  CHECK(joining.state.expectedCount() == 6);
  CHECK(slotTarget(joining.state, lim) == 4);
  CHECK(store->get(stateKey(e.version)).find("waiting 3") != std::string::npos);
  CHECK(hydrated(reader, joining.state) == *expect);
  // Positions and the ring: the waiting nodes after the members, in their order.
  CHECK(position(*store, joining.state, RoundState::List::Expected, "n9")->index == 5);
  CHECK_FALSE(position(*store, joining.state, RoundState::List::Expected, "n1"));
  CHECK_FALSE(position(*store, joining.state, RoundState::List::Expected, "n5"));
  CHECK(ringTarget(*store, joining.state, "n3") == "n8");
  CHECK(ringTarget(*store, joining.state, "n8") == "n9");
  CHECK(ringTarget(*store, joining.state, "n7") == "n0");
  CHECK(ringTarget(*store, joining.state, "n0") == "n2");
  // One that registered after the count was read is not expected (it re-joins as a newcomer).
  CHECK(scalable::joinWaitingList(*store, r, NodeInfo{.id = "n6", .addr = "10.0.0.6"}) == 4);
  CHECK_FALSE(position(*store, joining.state, RoundState::List::Expected, "n6"));
  CHECK(decodeState(encodeState(joining.state), "k") == joining.state);
  // A version naming more waiting nodes than ever wrote their entries is forged.
  RoundState forged = joining.state;
  forged.expectedList.waiting = 9;
  forged.expectedList.count += 6;
  RoundState g = writeAndRead(*store, reader, e.version + 1, forged);
  CHECK_THROWS_WITH(reader.hydrate(g), Catch::Contains("waiting entries never written"));
}

// The waiting list's counters (scalable/waiting_list.h) are store values anyone with access can
// ADD to: what they say is checked before a re-form trusts it.
TEST_CASE("the waiting list's counters: nobody waiting costs one check, an entry in flight is "
          "not counted, a forged count or index is refused naming the key",
          "[rdzv][log]") {
  auto store = std::make_shared<MemoryStore>();
  const int64_t r = 3;
  const std::string count = scalable::waitingCountKey(r), written = scalable::waitingWrittenKey(r);
  CHECK(scalable::readWaitingCount(*store, r) == 0);
  CHECK_FALSE(store->check({count}));  // no counter created by reading it
  CHECK(scalable::joinWaitingList(*store, r, NodeInfo{.id = "a", .addr = "10.0.0.1"}) == 1);
  CHECK(scalable::joinWaitingList(*store, r, NodeInfo{.id = "b", .addr = "10.0.0.2"}) == 2);
  CHECK(scalable::readWaitingCount(*store, r) == 2);
  // A third took its index but has not written its entry yet: the count and the written count
  // disagree, so no entry is vouched for and none is expected (they re-join as newcomers).
  store->add(count, 1);
  CHECK(scalable::readWaitingCount(*store, r) == 0);
  // A written count above the count was forged.
  store->add(written, 5);
  CHECK_THROWS_WITH(scalable::readWaitingCount(*store, r),
                    Catch::Contains("'" + count + "' counts 3") &&
                        Catch::Contains("corrupt or forged (fewer than written)"));
  // A counter driven below zero hands out an index below 1: the arrival refuses it.
  auto other = std::make_shared<MemoryStore>();
  other->add(count, -7);
  CHECK_THROWS_WITH(scalable::joinWaitingList(*other, r, NodeInfo{.id = "c", .addr = "10.0.0.3"}),
                    Catch::Contains("'" + count + "' counts -6") &&
                        Catch::Contains("an index below 1"));
  CHECK_FALSE(other->check({written}));  // and counts itself nowhere
}

TEST_CASE("spilled lists: an arrival into a running round with room writes no list (the member "
          "list and the newcomer), and loads as transition::arrive's state",
          "[rdzv][log]") {
  auto store = std::make_shared<MemoryStore>();
  const JobLimits lim{.minNodes = 3, .maxNodes = 4, .maxRestarts = 2};
  StateLog log(*store, lim, /*spill=*/true);
  Versioned v = joinNodes(log, lim, 3);
  v = log.update(v, [&](const RoundState& s) { return transition::closeAtDeadline(s, s.round, lim); }).now;
  REQUIRE(v.state.phase == Phase::Closed);
  const NodeInfo late{.id = "n9", .addr = "10.0.0.9"};
  const std::optional<RoundState> expect = transition::arrive(v.state, late, lim);
  REQUIRE(expect);
  StateLog reader(*store, lim);
  const int64_t lists = store->add("lists", 0);
  const Versioned e = arriveNode(log, v, late).now;
  CHECK(store->add("lists", 0) == lists);
  const Versioned joining = reader.read(e.version);
  REQUIRE(joining.state.phase == Phase::Joining);
  CHECK(joining.state.expectedList.with == "n9");
  CHECK(joining.state.expectedCount() == 4);
  CHECK(slotTarget(joining.state, lim) == 4);
  CHECK(hydrated(reader, joining.state) == *expect);
  CHECK(ringTarget(*store, joining.state, "n2") == "n9");
  CHECK(ringTarget(*store, joining.state, "n9") == "n0");
  CHECK(ringTarget(*store, joining.state, "n0") == "n1");
  CHECK(decodeState(encodeState(joining.state), "k") == joining.state);
  // An arrival at a joining round writes nothing (there, a node takes a slot).
  StateLog writer(*store, lim, /*spill=*/true);
  const Versioned after = writer.read(e.version);
  CHECK_FALSE(arriveNode(writer, after, late).wrote);
}

TEST_CASE("a joiners' list holds the id keys of joiners too late for its count: they are not "
          "members, where the same key in another list is a forgery", "[rdzv][log]") {
  // Arrival ranks: every joiner of round r writes its entry and id key into list 10^9 + r; a
  // round closed with count 1 leaves the second joiner's key there ("1 1": index 1, first rank
  // 1). When that joiner arrives after the close, looking itself up must say "not a member"
  // (it then joins the next round), not "corrupt or forged" (its agent used to exit 1).
  MemoryStore store;
  RoundState s;
  s.round = 1;
  s.phase = Phase::Closed;
  s.worldSize = 1;
  s.masterAddr = "10.0.0.1";
  s.membersList = ListRef{.ref = kJoinerListBase + 1, .count = 1};
  store.set(listIdKey(kJoinerListBase + 1, "first"), "0 0");
  store.set(listIdKey(kJoinerListBase + 1, "late"), "1 1");
  const auto first = position(store, s, RoundState::List::Members, "first");
  REQUIRE(first);
  CHECK(first->index == 0);
  CHECK_FALSE(position(store, s, RoundState::List::Members, "late"));
  CHECK_FALSE(position(store, s, RoundState::List::Members, "absent"));
  // Malformed is forged in any list.
  store.set(listIdKey(kJoinerListBase + 1, "bad"), "one 0");
  CHECK_THROWS_WITH(position(store, s, RoundState::List::Members, "bad"), Catch::Contains("forged"));
  // In a list a closer wrote (refs below 10^9) an index beyond its count is a forgery.
  s.membersList = ListRef{.ref = 7, .count = 1};
  store.set(listIdKey(7, "late"), "1 1");
  CHECK_THROWS_WITH(position(store, s, RoundState::List::Members, "late"),
                    Catch::Contains("l/7/id/late") && Catch::Contains("forged"));
}

TEST_CASE("a failed in-process recovery restarts the round without spending again: the same "
          "state as the transition, loading no list on a spilled log, nothing on a round that "
          "is over", "[rdzv][log]") {
  for (const bool spill : {false, true}) {
    INFO("spilled lists: " << spill);
    auto store = std::make_shared<MemoryStore>();
    const int n = 8;
    const JobLimits lim{.minNodes = n, .maxNodes = n, .maxRestarts = 1};
    StateLog log(*store, lim, spill);
    Versioned v = joinNodes(log, lim, n);
    REQUIRE(v.state.phase == Phase::Closed);
    StateLog reader(*store, lim);
    RoundState full = reader.read(v.version).state;
    reader.hydrate(full);
    const int64_t round = full.round;
    const std::string id = full.members.back().id;
    const auto r = recoverNode(log, v, round, id, 9, "rank died", false);
    REQUIRE(r.wrote);
    REQUIRE(r.now.state.restarts == 1);  // the last restart

    auto traffic = std::make_shared<StoreTraffic>();
    CountingStore counted(store, traffic);
    StateLog a(counted, lim, spill);
    const Versioned known = spill ? a.read(r.now.version) : r.now;
    const auto f = failRecoveredNode(a, known, round, id, "the spare died");
    REQUIRE(f.wrote);
    CHECK(f.now.state.round == round + 1);
    CHECK(f.now.state.phase == Phase::Joining);
    CHECK(f.now.state.restarts == 1);
    if (spill) CHECK(traffic->snapshot().bytes < 4096);  // no list loaded
    RoundState h = reader.read(f.now.version).state;
    reader.hydrate(h);
    RoundState recovered = reader.read(r.now.version).state;
    reader.hydrate(recovered);
    const auto expect =
        transition::failRecoveredWorkers(recovered, round, id, "the spare died", lim);
    REQUIRE(expect);
    CHECK(h == *expect);
    // Reported again, or by another node, on the round that is over: nothing written.
    const auto again = failRecoveredNode(a, r.now, round, full.members[0].id, "late");
    CHECK_FALSE(again.wrote);
    CHECK(again.now.version == f.now.version);
  }
}
