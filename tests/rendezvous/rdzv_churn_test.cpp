// Churn (issue 20): agents -- the real DynamicRendezvous with heartbeats, as threads -- leave,
// die, arrive and fail their workers in a seeded random order (DDPRUN_TEST_SEED, printed)
// against a real store on loopback, over 20 rounds. After every round each live agent's
// view is checked (bench/rendezvous_swarm.h checkRound: dense unique node ranks, one
// membership, one world size, prefix-sum offsets, one MASTER_ADDR:PORT), every live agent is in
// it, the restart count moved only on failures, and at the end the exit barrier finishes the job.
// Run with node ranks kept from round to round and with arrival ranks (the rounds closed from
// the counters: DynamicRendezvousOptions::arrivalRanks).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <future>
#include <random>

#include "base/log.h"
#include "bench/rendezvous_swarm.h"
#include "rdzv_agents.h"

using namespace rdzvtest;

TEST_CASE("churn: agents leave, die, arrive and fail at random, every round keeps the invariants") {
  ddprun::log::setLevel(ddprun::log::Level::Warn);
  const bool arrival = GENERATE(false, true);
  const char* env = std::getenv("DDPRUN_TEST_SEED");
  const uint64_t seed =
      env && *env ? std::strtoull(env, nullptr, 10) : std::random_device{}() % 1'000'000 + 1;
  std::printf("rdzv churn: DDPRUN_TEST_SEED=%llu\n", static_cast<unsigned long long>(seed));
  INFO("seed " << seed << (arrival ? ", arrival ranks" : ", stable ranks"));
  std::mt19937_64 rng(seed);
  ThreadedStoreServer server({.host = "127.0.0.1", .port = 0});
  const JobLimits lim{.minNodes = 2, .maxNodes = 6, .maxRestarts = 100};
  int nextAddr = 2;
  auto newAgent = [&] {
    auto o = agentOptions(server.port(), "churn", nextAddr++, lim);
    o.nproc = static_cast<int>(rng() % 3) + 1;
    o.lastCallTimeout = Millis(600'000);  // rounds close by their target, never by the clock
    o.joinTimeout = Millis(30'000);
    o.arrivalRanks = arrival;
    return makeAgent(o);
  };
  std::vector<std::unique_ptr<Agent>> live;
  for (int i = 0; i < 4; ++i) live.push_back(newAgent());
  std::vector<Agent*> ptrs;
  for (auto& a : live) ptrs.push_back(a.get());
  // The first round closes at MAX or by its last call: with 600 s, only when a 5th and 6th come.
  live.push_back(newAgent());
  live.push_back(newAgent());
  ptrs.clear();
  for (auto& a : live) ptrs.push_back(a.get());
  std::vector<RoundInfo> rounds = allNextRound(ptrs);
  // The slot join's agents do not read the membership: the checker reads it from the store.
  auto check = [&](const std::vector<RoundInfo>& rs) {
    const TcpStoreOptions store{.host = "127.0.0.1", .port = server.port()};
    const auto members = ddprun::bench::membersOfRound(store, "churn", lim, rs.at(0).round);
    return ddprun::bench::checkRound(rs, &members);
  };
  int restarts = 0;
  for (int step = 0; step < 20; ++step) {
    INFO("step " << step);
    REQUIRE(check(rounds) == "");
    REQUIRE(rounds[0].nodeCount == static_cast<int>(live.size()));
    for (const auto& r : rounds) CHECK(r.restartCount == restarts);
    const int n = static_cast<int>(live.size());
    // Draw an action that keeps the job within MIN..MAX.
    int action = static_cast<int>(rng() % 4);  // 0 leave, 1 die, 2 arrive, 3 fail
    if (action <= 1 && n <= lim.minNodes) action = 2;
    if (action == 2 && n >= lim.maxNodes) action = 3;
    const size_t who = rng() % live.size();
    INFO("action " << action << " on agent " << who << " of " << n);
    std::future<RoundInfo> newcomer;
    std::vector<Agent*> notified;  // the agents that must hear that the round is over
    if (action == 0) {
      live[who]->rdzv->leave("churn");
      live.erase(live.begin() + static_cast<long>(who));
      for (auto& a : live) notified.push_back(a.get());
    } else if (action == 1) {
      live.erase(live.begin() + static_cast<long>(who));  // its heartbeats stop: it is dead
      for (auto& a : live) notified.push_back(a.get());
    } else if (action == 2) {
      for (auto& a : live) notified.push_back(a.get());
      live.push_back(newAgent());
      Agent* c = live.back().get();
      newcomer = std::async(std::launch::async, [c] { return c->rdzv->nextRound(); });
    } else {
      REQUIRE(live[who]->rdzv->reportFailure(1, "churn") ==
              DynamicRendezvous::AfterFailure::Restart);
      ++restarts;
      for (size_t i = 0; i < live.size(); ++i)
        if (i != who) notified.push_back(live[i].get());
    }
    for (Agent* a : notified) {
      auto e = a->events.next(Millis(10'000));
      REQUIRE(e);
      CHECK(e->kind == RoundEvent::Kind::Superseded);
    }
    std::vector<Agent*> joiners;
    for (auto& a : live)
      if (action != 2 || a.get() != live.back().get()) joiners.push_back(a.get());
    rounds = allNextRound(joiners);
    if (action == 2) rounds.push_back(newcomer.get());
  }
  REQUIRE(check(rounds) == "");
  {
    // Every version of the job -- closes, arrivals, departures, evictions by the heartbeat ring,
    // failures -- names its lists instead of carrying them: O(1) bytes whatever N.
    TcpStore raw(TcpStoreOptions{.host = "127.0.0.1", .port = server.port()});
    const std::string prefix = "ddprun/rdzv/churn/";
    int64_t versions = 0, fromCounters = 0, deltas = 0;
    for (int64_t v = 1; raw.check({prefix + stateKey(v)}); ++v, ++versions) {
      const std::string text = raw.get(prefix + stateKey(v));
      // Closed from the counters (arrival ranks): the member list the joiners wrote, 10^9 + r.
      if (text.find("\nmembers-list 1000000") != std::string::npos) ++fromCounters;
      // An eviction, departure or failure written as a delta: the member list (without one).
      if (text.find(" members") != std::string::npos &&
          text.find("\nexpected-list ") != std::string::npos)
        ++deltas;
      INFO("version " << v << ":\n" << text);
      CHECK(text.find("\nmember ") == std::string::npos);
      CHECK(text.find("\nexpected ") == std::string::npos);
      CHECK(text.find("\nwaiting ") == std::string::npos);
    }
    CHECK(versions >= 20);
    INFO(fromCounters << " rounds closed from the counters, " << deltas << " removal deltas");
    if (arrival) CHECK(fromCounters >= 10);
    else CHECK(fromCounters == 0);
    CHECK(deltas >= 1);
  }
  std::vector<std::future<DynamicRendezvous::AfterSuccess>> done;
  for (auto& a : live)
    done.push_back(std::async(std::launch::async, [p = a.get()] { return p->rdzv->finishRound(); }));
  for (auto& f : done) CHECK(f.get() == DynamicRendezvous::AfterSuccess::Finished);
}
