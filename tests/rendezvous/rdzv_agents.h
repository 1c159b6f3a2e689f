#pragma once
// Test helpers: agents (DynamicRendezvous objects) as threads against one real StoreServer,
// each recording the events its watcher delivers.
#include <catch2/catch.hpp>

#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>

#include "rendezvous/dynamic_rendezvous.h"
#include "rendezvous/threaded_store_server.h"

namespace rdzvtest {

using namespace ddprun::rendezvous;
using ddprun::rendezvous::Millis;

// Events delivered to one agent, waited for with a timeout.
class Events {
 public:
  void push(const RoundEvent& e) {
    {
      std::lock_guard<std::mutex> g(mu_);
      q_.push_back(e);
    }
    cv_.notify_all();
  }
  std::optional<RoundEvent> next(Millis timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !q_.empty(); })) return std::nullopt;
    RoundEvent e = q_.front();
    q_.pop_front();
    return e;
  }
  size_t size() {
    std::lock_guard<std::mutex> g(mu_);
    return q_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RoundEvent> q_;
};

struct Agent {
  Events events;
  std::unique_ptr<DynamicRendezvous> rdzv;
};

// The agents' heartbeat: a beat every 100 ms, a node evicted after 8 missed beats. Short, so
// that tests of a lost node run fast, but not so short that a live agent is evicted when its
// writer thread is held up: with 3 beats (300 ms), an agent of a test under the sanitizers on a
// loaded 2-core machine was evicted while alive, which failed tests that never meant to lose it.
constexpr Millis kBeatInterval{100};
constexpr int kMissedBeats = 8;
constexpr Millis kHeartbeatBound = kBeatInterval * kMissedBeats;

// Options for an agent on 127.0.0.<n> against the server on `port`, with short timeouts.
inline DynamicRendezvousOptions agentOptions(uint16_t port, const std::string& runId, int n,
                                             JobLimits lim) {
  DynamicRendezvousOptions o;
  o.runId = runId;
  o.store.host = "127.0.0.1";
  o.store.port = port;
  o.store.timeout = Millis(5'000);
  o.store.connectTimeout = Millis(2'000);
  o.limits = lim;
  o.localAddr = "127.0.0." + std::to_string(n);
  o.joinTimeout = Millis(10'000);
  o.lastCallTimeout = Millis(300);
  o.closeTimeout = Millis(2'000);
  o.exitBarrierTimeout = Millis(10'000);
  o.heartbeat = {.interval = kBeatInterval, .missedBeats = kMissedBeats};
  return o;
}

inline std::unique_ptr<Agent> makeAgent(DynamicRendezvousOptions o) {
  auto a = std::make_unique<Agent>();
  Events* ev = &a->events;
  a->rdzv = std::make_unique<DynamicRendezvous>(std::move(o),
                                                [ev](const RoundEvent& e) { ev->push(e); });
  return a;
}

// nextRound() on every agent at once; returns the rounds by agent index.
inline std::vector<RoundInfo> allNextRound(const std::vector<Agent*>& agents) {
  std::vector<std::future<RoundInfo>> fs;
  for (Agent* a : agents)
    fs.push_back(std::async(std::launch::async, [a] { return a->rdzv->nextRound(); }));
  std::vector<RoundInfo> out;
  for (auto& f : fs) out.push_back(f.get());
  return out;
}

// What every round promises in either rank order (arrival, the default, or stable): the agents
// of `rounds` (agent i on 127.0.0.<addrs[i]> with nproc[i] workers) hold dense unique node ranks
// of one round of them all, each node's first global rank is the prefix sum of nproc in node
// rank order, and MASTER_ADDR is the address of the agent that holds node rank 0 (which hosts
// that round's workers' store). Returns the agent index by node rank.
inline std::vector<size_t> checkOneRound(const std::vector<RoundInfo>& rounds,
                                         const std::vector<int>& addrs,
                                         const std::vector<int>& nproc) {
  REQUIRE(rounds.size() == addrs.size());
  REQUIRE(rounds.size() == nproc.size());
  const int n = static_cast<int>(rounds.size());
  std::vector<size_t> byRank(rounds.size(), rounds.size());
  int world = 0;
  for (int p : nproc) world += p;
  for (size_t i = 0; i < rounds.size(); ++i) {
    INFO("agent " << i << " (127.0.0." << addrs[i] << "): node rank " << rounds[i].nodeRank);
    CHECK(rounds[i].round == rounds[0].round);
    CHECK(rounds[i].nodeCount == n);
    CHECK(rounds[i].worldSize == world);
    CHECK(rounds[i].masterPort == rounds[0].masterPort);
    CHECK(rounds[i].masterPort != 0);
    REQUIRE(rounds[i].nodeRank >= 0);
    REQUIRE(rounds[i].nodeRank < n);
    CHECK(byRank[rounds[i].nodeRank] == rounds.size());  // no node rank held twice
    byRank[rounds[i].nodeRank] = i;
  }
  int offset = 0;
  for (int r = 0; r < n; ++r) {
    const size_t i = byRank[r];
    INFO("node rank " << r << ": agent " << i);
    REQUIRE(i < rounds.size());  // every node rank is held
    CHECK(rounds[i].rankOffset == offset);
    CHECK(rounds[i].masterAddr == "127.0.0." + std::to_string(addrs[byRank[0]]));
    offset += nproc[i];
  }
  return byRank;
}

}  // namespace rdzvtest
