// Agents as threads against a real StoreServer on loopback: rounds, ranks, elasticity.
#include <set>
#include <thread>

#include "rdzv_agents.h"
#include "rendezvous/tcp_store.h"

using namespace rdzvtest;
using ddprun::ConfigError;
using ddprun::TimeoutError;

namespace {
// True once `pred` holds, polling for up to 2 s (the server counts connections asynchronously).
template <typename Pred>
bool eventually(Pred pred) {
  for (int i = 0; i < 200; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(Millis(10));
  }
  return false;
}

// `o` with node ranks in arrival order (`arrival`, the default) or rank_order=stable.
DynamicRendezvousOptions withRankOrder(DynamicRendezvousOptions o, bool arrival) {
  o.arrivalRanks = arrival;
  return o;
}

// The event each of `agents` hears next, each required within 5 s and checked to say that its
// round was superseded.
std::vector<RoundEvent> superseded(std::initializer_list<Agent*> agents) {
  std::vector<RoundEvent> events;
  for (Agent* x : agents) {
    auto e = x->events.next(Millis(5'000));
    REQUIRE(e);
    CHECK(e->kind == RoundEvent::Kind::Superseded);
    events.push_back(*e);
  }
  return events;
}
}  // namespace

// Node ranks in arrival order (the default, as torchrun): dense, unique, node rank 0 names the
// master; which agent holds which depends on who took a slot first.
TEST_CASE("4 agents with different nproc form one round in arrival order", "[rdzv][dynamic]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  std::vector<std::unique_ptr<Agent>> agents;
  std::vector<Agent*> ptrs;
  for (int i = 0; i < 4; ++i) {
    auto o = agentOptions(server.port(), "job4", 2 + i, {.minNodes = 4, .maxNodes = 4});
    CHECK(o.arrivalRanks);  // the default
    o.nproc = i + 1;
    agents.push_back(makeAgent(o));
    ptrs.push_back(agents.back().get());
  }
  auto rounds = allNextRound(ptrs);
  checkOneRound(rounds, {2, 3, 4, 5}, {1, 2, 3, 4});
  for (const auto& r : rounds) {
    CHECK(r.round == 0);
    CHECK(r.worldSize == 10);
    CHECK(r.restartCount == 0);
  }
}

// rank_order=stable (the opt-in): newcomers in address order.
TEST_CASE("4 agents with different nproc form one round, rank_order=stable: address order",
          "[rdzv][dynamic]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  std::vector<std::unique_ptr<Agent>> agents;
  std::vector<Agent*> ptrs;
  for (int i = 0; i < 4; ++i) {
    auto o = agentOptions(server.port(), "job4", 2 + i, {.minNodes = 4, .maxNodes = 4});
    o.arrivalRanks = false;
    o.nproc = i + 1;  // 127.0.0.2 runs 1 worker, .3 runs 2, .4 runs 3, .5 runs 4
    agents.push_back(makeAgent(o));
    ptrs.push_back(agents.back().get());
  }
  auto rounds = allNextRound(ptrs);
  for (int i = 0; i < 4; ++i) {
    INFO("agent " << i);
    CHECK(rounds[i].round == 0);
    CHECK(rounds[i].nodeCount == 4);
    CHECK(rounds[i].worldSize == 10);
    CHECK(rounds[i].nodeRank == i);  // address order
    CHECK(rounds[i].rankOffset == i * (i + 1) / 2);  // prefix sums of nproc 1, 2, 3, 4
    CHECK(rounds[i].masterAddr == "127.0.0.2");
    CHECK(rounds[i].masterPort == rounds[0].masterPort);
    CHECK(rounds[i].masterPort != 0);
    CHECK(rounds[i].restartCount == 0);
  }
}

// In both rank orders; with rank_order=stable the node ranks are kept from the round before.
TEST_CASE("MIN:MAX: the last call closes with MIN, an arrival starts a new round",
          "[rdzv][dynamic]") {
  const bool arrival = GENERATE(true, false);
  INFO((arrival ? "rank_order=arrival (default)" : "rank_order=stable"));
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const JobLimits lim{.minNodes = 1, .maxNodes = 3};
  auto opts = [&](int n) {
    return withRankOrder(agentOptions(server.port(), "elastic", n, lim), arrival);
  };
  auto a = makeAgent(opts(7));
  auto b = makeAgent(opts(3));
  const auto t0 = Clock::now();
  auto r0 = allNextRound({a.get(), b.get()});
  const auto waited = Clock::now() - t0;
  CHECK(waited >= Millis(250));  // the last call (300 ms) ran: MAX was not reached
  CHECK(r0[0].nodeCount == 2);
  checkOneRound(r0, {7, 3}, {1, 1});
  if (!arrival) {
    CHECK(r0[0].nodeRank == 1);  // 127.0.0.7 after 127.0.0.3
    CHECK(r0[1].nodeRank == 0);
  }

  // A third node arrives while the job runs: both running agents hear of it at once.
  auto c = makeAgent(opts(1));
  auto fc = std::async(std::launch::async, [&] { return c->rdzv->nextRound(); });
  for (const RoundEvent& e : superseded({a.get(), b.get()})) {
    CHECK(e.round == 0);
    CHECK(e.message.find("arrived") != std::string::npos);
  }
  const auto t1 = Clock::now();
  auto r1 = allNextRound({a.get(), b.get()});
  RoundInfo rc = fc.get();
  // Every expected node came back: no last-call wait this time.
  CHECK(Clock::now() - t1 < Millis(250));
  CHECK(r1[0].round == 1);
  CHECK(r1[0].nodeCount == 3);
  checkOneRound({r1[0], r1[1], rc}, {7, 3, 1}, {1, 1, 1});
  if (!arrival) {
    CHECK(r1[0].nodeRank == 1);  // kept
    CHECK(r1[1].nodeRank == 0);  // kept
    CHECK(rc.nodeRank == 2);  // the newcomer takes the free rank, though its address sorts first
  }
  CHECK(r1[0].restartCount == 0);  // membership changes spend no restart
  CHECK(a->events.size() == 0);
}

// In both rank orders: with arrival ranks (the default) the survivors' node ranks follow the
// order in which they re-join, as torchrun's; with rank_order=stable b keeps rank 1.
TEST_CASE("a clean leave re-forms the others without it", "[rdzv][dynamic]") {
  const bool arrival = GENERATE(true, false);
  INFO((arrival ? "rank_order=arrival (default)" : "rank_order=stable"));
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const JobLimits lim{.minNodes = 1, .maxNodes = 3};
  auto opts = [&](int n) {
    return withRankOrder(agentOptions(server.port(), "leave", n, lim), arrival);
  };
  auto a = makeAgent(opts(2));
  auto b = makeAgent(opts(3));
  auto c = makeAgent(opts(4));
  allNextRound({a.get(), b.get(), c.get()});  // MAX reached: closes at once
  a->rdzv->leave("SIGTERM");
  for (const RoundEvent& e : superseded({b.get(), c.get()})) {
    CHECK(e.message.find("left: SIGTERM") != std::string::npos);
  }
  auto r = allNextRound({b.get(), c.get()});
  CHECK(r[0].nodeCount == 2);
  checkOneRound(r, {3, 4}, {1, 1});
  if (!arrival) {
    CHECK(r[0].nodeRank == 1);  // b keeps rank 1
    CHECK(r[1].nodeRank == 0);  // c had rank 2, which is gone: it takes rank 0
  }
  CHECK(a->events.size() == 0);  // the leaver is not told about its own departure
}

TEST_CASE("a round watcher on its agent's connection: one event per round, the connection "
          "taken back and given back, an interrupt is not a lost store", "[rdzv][dynamic]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const JobLimits lim{.minNodes = 1, .maxNodes = 3};
  auto opts = [&](int n) {
    auto o = agentOptions(server.port(), "shared", n, lim);
    o.watcherOnAgentConnection = true;
    return o;
  };
  auto a = makeAgent(opts(2));
  auto b = makeAgent(opts(3));
  allNextRound({a.get(), b.get()});  // closed by the last call, with 2
  // Per agent: its own connection (shared with the watcher, which WAITs on it now) and the
  // heartbeat writer's and monitor's: 3, not 4.
  CHECK(eventually([&] { return server.stats().connections == 6; }));
  // A call on the agent's thread while the watcher waits on its connection: the watcher lets go
  // of it (CANCEL_WAIT) and watches on after.
  CHECK(a->rdzv->roundMembers().size() == 2);
  auto c = makeAgent(opts(4));
  auto fc = std::async(std::launch::async, [&] { return c->rdzv->nextRound(); });
  superseded({a.get(), b.get()});
  std::this_thread::sleep_for(Millis(200));
  CHECK(a->events.size() == 0);  // once per round, the pause notwithstanding
  auto r = allNextRound({a.get(), b.get()});
  CHECK(fc.get().nodeCount == 3);
  CHECK(r[0].nodeCount == 3);
  // interrupt() cuts the connection the watcher waits on: the agent leaves, nobody reports a
  // lost store.
  a->rdzv->interrupt();
  a->rdzv->leave("SIGTERM");
  for (const RoundEvent& e : superseded({b.get(), c.get()})) {
    CHECK(e.message.find("left: SIGTERM") != std::string::npos);
  }
  CHECK(a->events.size() == 0);
}

TEST_CASE("a state change ends the heartbeat monitor's WAIT without a reconnect: 3 connections "
          "per agent through forming, re-forming and a departure", "[rdzv][dynamic]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const JobLimits lim{.minNodes = 1, .maxNodes = 3};
  auto opts = [&](int n) {
    auto o = agentOptions(server.port(), "monitor", n, lim);
    o.watcherOnAgentConnection = true;  // as the launcher's agents
    return o;
  };
  auto a = makeAgent(opts(2));
  auto b = makeAgent(opts(3));
  allNextRound({a.get(), b.get()});
  // Each state change (joined, closed, re-formed) moves the monitors' ring: their WAIT is
  // cancelled on the server (CANCEL_WAIT), the connection kept.
  auto c = makeAgent(opts(4));
  auto fc = std::async(std::launch::async, [&] { return c->rdzv->nextRound(); });
  for (Agent* x : {a.get(), b.get()}) REQUIRE(x->events.next(Millis(5'000)));
  auto r = allNextRound({a.get(), b.get()});
  CHECK(fc.get().nodeCount == 3);
  CHECK(r[0].nodeCount == 3);
  b->rdzv->leave("SIGTERM");
  for (Agent* x : {a.get(), c.get()}) REQUIRE(x->events.next(Millis(5'000)));
  r = allNextRound({a.get(), c.get()});
  CHECK(r[0].nodeCount == 2);
  std::this_thread::sleep_for(Millis(300));  // beats and ring moves after the last round
  // Every connection ever taken: the agent's, the heartbeat writer's and monitor's, per agent.
  CHECK(server.stats().accepted == 9);
}

TEST_CASE("two jobs on one store never see each other", "[rdzv][dynamic]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const JobLimits lim{.minNodes = 2, .maxNodes = 2};
  auto a1 = makeAgent(agentOptions(server.port(), "jobA", 2, lim));
  auto b1 = makeAgent(agentOptions(server.port(), "jobB", 3, lim));
  auto a2 = makeAgent(agentOptions(server.port(), "jobA", 4, lim));
  auto b2 = makeAgent(agentOptions(server.port(), "jobB", 5, lim));
  auto r = allNextRound({a1.get(), b1.get(), a2.get(), b2.get()});
  // Each job's round holds its own two nodes (in arrival order); the slot join's agents read
  // their own entry only, so the ranks and master say who is in it: one of the job's own.
  for (const auto& x : r) CHECK(x.nodeCount == 2);
  checkOneRound({r[0], r[2]}, {2, 4}, {1, 1});
  checkOneRound({r[1], r[3]}, {3, 5}, {1, 1});
}

TEST_CASE("nodes with different --nnodes for one job are refused", "[rdzv][dynamic]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  auto a = makeAgent(agentOptions(server.port(), "cfg", 2, {.minNodes = 2, .maxNodes = 2}));
  CHECK_THROWS_WITH(makeAgent(agentOptions(server.port(), "cfg", 3, {.minNodes = 1, .maxNodes = 2})),
                    Catch::Contains("nnodes=1:2") && Catch::Contains("nnodes=2:2"));
  CHECK_THROWS_AS(makeAgent(agentOptions(server.port(), "bad id", 3, {})), ConfigError);
  // Nor nodes with different rank orders: both named (the job's first node has the default,
  // arrival; this one asks for stable, as an agent of an older ddprun would have by default).
  auto o = agentOptions(server.port(), "cfg", 4, {.minNodes = 2, .maxNodes = 2});
  o.arrivalRanks = false;
  CHECK_THROWS_WITH(makeAgent(o), Catch::Contains("backend=c10d but") &&
                                      Catch::Contains("rank_order=arrival: give") &&
                                      Catch::Contains("every node rank_order=stable"));
  // The hint is for the rank order alone: other settings differ, no hint.
  CHECK_THROWS_WITH(
      makeAgent(agentOptions(server.port(), "cfg", 5, {.minNodes = 1, .maxNodes = 2})),
      !Catch::Contains("arrival order are the default"));
}

TEST_CASE("a round below MIN fails after join_timeout, naming the counts", "[rdzv][dynamic]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  auto o = agentOptions(server.port(), "lonely", 2, {.minNodes = 2, .maxNodes = 2});
  o.joinTimeout = Millis(300);
  auto a = makeAgent(o);
  CHECK_THROWS_WITH(a->rdzv->nextRound(),
                    Catch::Contains("join_timeout") && Catch::Contains("1 node(s) joined, MIN=2"));
}

TEST_CASE("a full job keeps an arrival waiting until a place frees up", "[rdzv][dynamic]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const JobLimits lim{.minNodes = 1, .maxNodes = 2};
  auto a = makeAgent(agentOptions(server.port(), "full", 2, lim));
  auto b = makeAgent(agentOptions(server.port(), "full", 3, lim));
  allNextRound({a.get(), b.get()});
  auto c = makeAgent(agentOptions(server.port(), "full", 4, lim));
  auto fc = std::async(std::launch::async, [&] { return c->rdzv->nextRound(); });
  CHECK_FALSE(a->events.next(Millis(400)));  // the job is full: nobody restarts for c
  b->rdzv->leave("scaled down");
  REQUIRE(a->events.next(Millis(5'000)));
  auto ra = a->rdzv->nextRound();
  auto rc = fc.get();
  CHECK(ra.nodeCount == 2);
  checkOneRound({ra, rc}, {2, 4}, {1, 1});  // in arrival order: either may be node rank 0
}

// The slot join (issue 20): on the ddprun store the joiners of a round take slots and write
// their own records; the state log gets one version per round formed, whatever the number of
// joiners (the join of today's log cost each joiner a compare-set of the whole state).
TEST_CASE("forming a round of 8 appends one state version, each joiner takes a slot, the exit barrier counts",
          "[rdzv][dynamic][slots]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const JobLimits lim{.minNodes = 4, .maxNodes = 8};
  std::vector<std::unique_ptr<Agent>> agents;
  std::vector<Agent*> ptrs;
  for (int i = 0; i < 8; ++i) {
    agents.push_back(makeAgent(agentOptions(server.port(), "eight", 2 + i, lim)));
    ptrs.push_back(agents.back().get());
  }
  auto rounds = allNextRound(ptrs);
  std::set<int> ranks;
  for (const auto& r : rounds) {
    ranks.insert(r.nodeRank);
    CHECK(r.nodeCount == 8);
    CHECK(r.worldSize == 8);
  }
  CHECK(ranks.size() == 8);  // dense and unique: 0..7
  CHECK(*ranks.rbegin() == 7);
  TcpStore client({.host = "127.0.0.1", .port = server.port(), .timeout = Millis(2'000)});
  const std::string job = "ddprun/rdzv/eight/";
  CHECK(client.check({job + "state/1"}));
  CHECK_FALSE(client.check({job + "state/2"}));  // nobody appended itself
  CHECK(client.add(job + "r/0/count", 0) >> 32 == 8);
  for (int s = 1; s <= 8; ++s) CHECK(client.check({job + "r/0/node/" + std::to_string(s)}));

  // A re-form after a leave is one version to open the round and one to close it.
  agents[0]->rdzv->leave("scaled down");
  std::vector<Agent*> rest(ptrs.begin() + 1, ptrs.end());
  for (Agent* a : rest) REQUIRE(a->events.next(Millis(5'000)));
  auto again = allNextRound(rest);
  CHECK(again[0].nodeCount == 7);
  CHECK(client.check({job + "state/3"}));
  CHECK_FALSE(client.check({job + "state/4"}));
  CHECK(client.add(job + "r/1/count", 0) >> 32 == 7);

  // The exit barrier: 7 nodes done at once count themselves (r/1/done) instead of each
  // appending itself: at most two more versions (finishing, Finished), and every node Finished.
  std::vector<std::future<DynamicRendezvous::AfterSuccess>> done;
  for (Agent* a : rest)
    done.push_back(std::async(std::launch::async, [a] { return a->rdzv->finishRound(); }));
  for (auto& f : done) CHECK(f.get() == DynamicRendezvous::AfterSuccess::Finished);
  CHECK_FALSE(client.check({job + "state/6"}));
  CHECK(client.add(job + "r/1/done", 0) == 7);
  for (int d = 1; d <= 7; ++d) CHECK(client.check({job + "r/1/done/" + std::to_string(d)}));
}

TEST_CASE("an expected node that dies before re-joining is evicted, and the round closes "
          "without waiting for the last call",
          "[rdzv][dynamic][slots]") {
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const JobLimits lim{.minNodes = 1, .maxNodes = 3};
  std::vector<std::unique_ptr<Agent>> agents;
  for (int i = 0; i < 3; ++i) {
    auto o = agentOptions(server.port(), "dies", 2 + i, lim);
    o.lastCallTimeout = Millis(600'000);  // only the eviction can close the re-formed round
    o.joinTimeout = Millis(20'000);
    agents.push_back(makeAgent(o));
  }
  allNextRound({agents[0].get(), agents[1].get(), agents[2].get()});  // MAX: closes at once
  agents[0]->rdzv->leave("scaled down");
  REQUIRE(agents[1]->events.next(Millis(5'000)));
  REQUIRE(agents[2]->events.next(Millis(5'000)));
  agents[2].reset();  // its heartbeats stop: to the others it is dead, and it never re-joins
  RoundInfo r = agents[1]->rdzv->nextRound();
  CHECK(r.round == 1);
  CHECK(r.nodeCount == 1);
  CHECK(r.nodeRank == 0);
}
