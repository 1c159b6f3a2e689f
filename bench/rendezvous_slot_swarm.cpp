// The swarm with the slot join (rendezvous/scalable/slot_join.h): each agent is a fiber
// (bench/fiber_scheduler.h) with one counted connection. Round 1: N agents join with target N. The harness then ends round 1
// as an eviction would, with one key (r/1/over = the number expected back, N-1); every survivor
// WAITs on it (its round watcher's wait, here on its only connection) and joins round 2 with
// target N-1. The harness reads every slot record on its own, uncounted connection to check the
// invariants (bench/rendezvous_swarm.h).
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>

#include "bench/fiber_scheduler.h"
#include "bench/rendezvous_swarm.h"
#include "rendezvous/prefix_store.h"
#include "rendezvous/scalable/slot_join.h"
#include "rendezvous/store_server.h"

namespace ddprun::bench {

using namespace ddprun::rendezvous;
namespace sc = ddprun::rendezvous::scalable;

namespace {

double secondsOf(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string overKeyOf(int64_t round) { return "r/" + std::to_string(round) + "/over"; }

struct SlotAgent {
  std::shared_ptr<StoreTraffic> traffic = std::make_shared<StoreTraffic>();
  sc::SlotRecord self;
  sc::Assignment first, second;
  Clock::time_point formedAt, reformedAt;
  StoreTraffic::Snapshot atFormed, atReformed;
  std::string error;
};

// Checks round `round` of the slot join: the membership read back from the slot records (on
// the harness's connection), each member's own record in its slot, then checkRound.
std::string checkSlotRound(Store& store, int64_t round, const std::vector<SlotAgent*>& members,
                           bool second) {
  if (members.empty()) return "no members";
  const sc::Assignment& any = second ? members[0]->second : members[0]->first;
  std::vector<NodeInfo> nodes;
  for (int64_t s = 1; s <= any.nodeCount; s += 1000) {
    std::vector<std::string> keys;
    for (int64_t t = s; t < std::min<int64_t>(s + 1000, any.nodeCount + 1); ++t)
      keys.push_back(sc::nodeKey(round, t));
    const auto values = store.multiGet(keys);
    for (size_t i = 0; i < keys.size(); ++i) {
      const sc::SlotRecord r = sc::decodeRecord(values[i], keys[i]);
      nodes.push_back(NodeInfo{.id = r.id, .addr = r.addr, .nproc = r.nproc, .masterPort = r.masterPort});
    }
  }
  std::vector<RoundInfo> views;
  for (SlotAgent* a : members) {
    const sc::Assignment& x = second ? a->second : a->first;
    if (x.nodeRank >= 0 && x.nodeRank < static_cast<int>(nodes.size()) &&
        nodes[x.nodeRank].id != a->self.id) {
      return "node rank " + std::to_string(x.nodeRank) + "'s slot holds another node's record";
    }
    RoundInfo i;  // the membership is passed once, not copied into every view
    i.round = round;
    i.nodeRank = x.nodeRank;
    i.nodeCount = x.nodeCount;
    i.rankOffset = x.rankOffset;
    i.worldSize = x.worldSize;
    i.masterAddr = x.masterAddr;
    i.masterPort = x.masterPort;
    views.push_back(std::move(i));
  }
  return checkRound(views, &nodes);
}

}  // namespace

SwarmResult runSlotSwarm(const std::string& storeBinary, const SwarmOptions& o) {
  raiseFileLimit();
  StoreProcess store(storeBinary);
  const int n = o.agents;
  const std::string prefix = "ddprun/rdzv/slots" + std::to_string(n) + "-" + std::to_string(::getpid());
  // A read timeout below the join timeout: the waits for `closed` are then single WAIT_GETs
  // (as with the defaults, read_timeout 60 s and join_timeout 600 s).
  TcpStoreOptions storeOptions{.host = "127.0.0.1", .port = store.port(), .timeout = o.timeout / 2,
                               .connectTimeout = o.timeout};
  std::mt19937_64 rng(o.seed);
  std::vector<Millis> arrival(n);
  std::vector<SlotAgent> agents(n);
  for (int i = 0; i < n; ++i) {
    arrival[i] = Millis(o.spread.count() > 0 ? static_cast<int64_t>(rng() % o.spread.count()) : 0);
    agents[i].self.nproc = 1 + static_cast<int>(rng() % std::max(1, o.maxNproc));
    agents[i].self.addr = "127.2." + std::to_string(i / 250) + "." + std::to_string(1 + i % 250);
    agents[i].self.id = agents[i].self.addr + "-" + std::to_string(i);
    agents[i].self.masterPort = static_cast<uint16_t>(20000 + i % 40000);
  }
  const int victim = static_cast<int>(rng() % n);

  // The agents are fibers of `pool` (agent i on scheduler i % o.loops); the main thread waits
  // on `cv`.
  FiberPool pool(o.loops);
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> go{false};  // the first arrival's time has come (fibers park on &go)
  int formed = 0, reformed = 0;
  Clock::time_point t0;
  const sc::SlotJoinOptions round1{.round = 1, .target = n, .minNodes = std::max(1, n - 1),
                                   .maxNodes = n, .lastCall = o.timeout, .timeout = o.timeout};
  auto body = [&](int i) {
    SlotAgent& a = agents[i];
    FiberScheduler& fibers = pool.of(i);
    while (!go) fibers.park(nullptr, &go, Clock::time_point::max());
    fibers.sleepUntil(t0 + arrival[i]);
    bool first = true;
    try {
      PrefixStore conn(prefix, std::make_shared<CountingStore>(
                                   std::make_shared<TcpStore>(storeOptions), a.traffic));
      a.first = sc::joinRound(conn, a.self, round1);
      a.formedAt = Clock::now();
      a.atFormed = a.traffic->snapshot();
      {
        std::lock_guard<std::mutex> g(mu);
        ++formed;
        first = false;
      }
      cv.notify_all();
      if (i == victim) return;  // dead: it re-joins nothing
      // The round watcher's wait: one WAIT_GET, woken when round 1 ends.
      const int expected = std::stoi(conn.get(overKeyOf(1)));
      a.second = sc::joinRound(conn, a.self,
                               {.round = 2, .target = expected, .minNodes = std::max(1, n - 1),
                                .maxNodes = n, .lastCall = o.timeout, .timeout = o.timeout});
      a.reformedAt = Clock::now();
      a.atReformed = a.traffic->snapshot();
    } catch (const std::exception& e) {
      a.error = e.what();
    }
    {
      std::lock_guard<std::mutex> g(mu);
      if (first) ++formed;
      else ++reformed;
    }
    cv.notify_all();
  };

  for (int i = 0; i < n; ++i) pool.spawn(i, [&body, i] { body(i); });
  pool.start();
  PrefixStore harness(prefix, std::make_shared<TcpStore>(storeOptions));  // uncounted
  const double cpu0 = store.cpuSeconds();
  const double self0 = StoreProcess::cpuSecondsOf(::getpid());
  t0 = Clock::now();  // published to the fibers by `go`
  go = true;
  pool.postAll([&](FiberScheduler& f) { f.wake(&go); });

  SwarmResult r;
  auto firstError = [&]() -> std::string {
    for (int i = 0; i < n; ++i)
      if (!agents[i].error.empty()) return "agent " + std::to_string(i) + ": " + agents[i].error;
    return "";
  };
  auto finish = [&](SwarmResult& res) {
    if (!res.reformSeconds) {
      // A failed run: unblock agents still waiting for a round to close or to end.
      try {
        harness.compareSet(sc::closedKey(1), "", "1 1");
        harness.compareSet(overKeyOf(1), "", std::to_string(n - 1));
        harness.compareSet(sc::closedKey(2), "", "1 1");
      } catch (const std::exception&) {
      }
    }
    pool.join();
    return res;
  };
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, o.timeout + o.spread + Millis(5'000), [&] { return formed == n; });
    if (formed != n) r.error = std::to_string(n - formed) + " agents' round 1 did not close";
  }
  if (r.error.empty()) r.error = firstError();
  std::vector<SlotAgent*> members;
  Clock::time_point last = t0, firstDone = Clock::time_point::max();
  std::vector<StoreTraffic::Snapshot> cost;
  if (r.error.empty()) {
    for (auto& a : agents) {
      if (!a.first.admitted) r.error = "agent " + a.self.id + " was not admitted to round 1";
      members.push_back(&a);
      cost.push_back(a.atFormed);
      last = std::max(last, a.formedAt);
    firstDone = std::min(firstDone, a.formedAt);
    }
  }
  if (r.error.empty() && o.corruptView && n >= 2) agents[0].first.nodeRank = agents[1].first.nodeRank;
  if (r.error.empty()) {
    r.error = checkSlotRound(harness, 1, members, false);
  }
  if (!r.error.empty()) return finish(r);
  r.formSeconds = secondsOf(last - t0);
  r.formFirstSeconds = secondsOf(firstDone - t0);
  r.formStoreCpu = store.cpuSeconds() - cpu0;
  r.formSwarmCpu = StoreProcess::cpuSecondsOf(::getpid()) - self0;
  r.form = costOf(cost);

  // The eviction: round 1 ends, N-1 expected back.
  const double cpu1 = store.cpuSeconds();
  const double self1 = StoreProcess::cpuSecondsOf(::getpid());
  harness.compareSet(overKeyOf(1), "", std::to_string(n - 1));
  const auto tEvict = Clock::now();
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, o.timeout + Millis(5'000), [&] { return reformed == n - 1; });
    if (reformed != n - 1) r.error = std::to_string(n - 1 - reformed) + " survivors did not re-form";
  }
  if (r.error.empty()) r.error = firstError();
  members.clear();
  cost.clear();
  last = tEvict;
  firstDone = Clock::time_point::max();
  if (r.error.empty()) {
    for (int i = 0; i < n; ++i) {
      if (i == victim) continue;
      if (!agents[i].second.admitted) r.error = "survivor " + agents[i].self.id + " was not admitted";
      members.push_back(&agents[i]);
      cost.push_back(agents[i].atReformed - agents[i].atFormed);
      last = std::max(last, agents[i].reformedAt);
      firstDone = std::min(firstDone, agents[i].reformedAt);
    }
  }
  if (r.error.empty()) {
    r.error = checkSlotRound(harness, 2, members, true);
  }
  if (r.error.empty()) {
    r.reformSeconds = secondsOf(last - tEvict);
      r.reformFirstSeconds = secondsOf(firstDone - tEvict);
    r.reformStoreCpu = store.cpuSeconds() - cpu1;
    r.reformSwarmCpu = StoreProcess::cpuSecondsOf(::getpid()) - self1;
    r.reform = costOf(cost);
  }
  return finish(r);
}

}  // namespace ddprun::bench
