#include "bench/rendezvous_swarm.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "base/errors.h"
#include "bench/fiber_scheduler.h"
#include "rendezvous/prefix_store.h"
#include "rendezvous/scalable/waiting_list.h"
#include "rendezvous/state_log.h"
#include "rendezvous/store_server.h"

extern char** environ;

namespace ddprun::bench {

using namespace ddprun::rendezvous;

StoreProcess::StoreProcess(const std::string& binary) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw Error("pipe: cannot start " + binary);
  std::vector<std::string> argv = {binary, "--host", "127.0.0.1", "--port", "0"};
  std::vector<char*> a;
  for (auto& s : argv) a.push_back(s.data());
  a.push_back(nullptr);
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e)
    if (std::string(*e).rfind("DDPRUN_LOG_LEVEL=", 0) != 0) env.emplace_back(*e);
  env.push_back("DDPRUN_LOG_LEVEL=warn");
  std::vector<char*> e;
  for (auto& s : env) e.push_back(s.data());
  e.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  // A session of its own: with the kernel's autogroup scheduling (sched_autogroup_enabled),
  // the store then gets a fair share of the CPU against this process as a whole, as a store on
  // its own host would, instead of one share among the 10,000 agents' threads.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
  const int rc = ::posix_spawn(&pid_, a[0], &fa, &attr, a.data(), e.data());
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&fa);
  ::close(out[1]);
  if (rc != 0) {
    ::close(out[0]);
    throw Error("cannot start " + binary);
  }
  // "ddprun-store listening on 127.0.0.1:PORT"
  std::string line;
  char c;
  while (::read(out[0], &c, 1) == 1 && c != '\n') line += c;
  ::close(out[0]);
  const auto colon = line.rfind(':');
  if (line.rfind("ddprun-store listening on ", 0) != 0 || colon == std::string::npos) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    throw Error(binary + " did not start (it said '" + line + "')");
  }
  port_ = static_cast<uint16_t>(std::stoi(line.substr(colon + 1)));
}

StoreProcess::~StoreProcess() {
  ::kill(pid_, SIGTERM);
  ::waitpid(pid_, nullptr, 0);
}

double StoreProcess::cpuSeconds() const { return cpuSecondsOf(pid_); }

double StoreProcess::cpuSecondsOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream rest(all.substr(all.rfind(')') + 2));  // after "pid (comm) "
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; rest >> field; ++i) {  // fields 14 and 15: utime, stime (clock ticks)
    if (i == 14) utime = std::stod(field);
    if (i == 15) {
      stime = std::stod(field);
      break;
    }
  }
  return (utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

std::string checkRound(const std::vector<RoundInfo>& rounds, const std::vector<NodeInfo>* membership) {
  if (rounds.empty()) return "no members";
  const RoundInfo& first = rounds.front();
  const std::vector<NodeInfo>& nodes = membership ? *membership : first.nodes;
  const int n = static_cast<int>(nodes.size());
  if (first.nodeCount != n || static_cast<int>(rounds.size()) != n) {
    return "round " + std::to_string(first.round) + ": " + std::to_string(rounds.size()) +
           " agents hold it, its membership has " + std::to_string(n) + " nodes, node count " +
           std::to_string(first.nodeCount);
  }
  int world = 0;
  std::vector<int> offset(n);
  for (int i = 0; i < n; ++i) {
    offset[i] = world;
    world += nodes[i].nproc;
  }
  std::vector<bool> seen(n);
  std::set<std::string> ids;
  for (const auto& node : nodes)
    if (!ids.insert(node.id).second) return "node " + node.id + " is a member twice";
  for (const RoundInfo& r : rounds) {
    if (r.round != first.round || (!r.nodes.empty() && r.nodes != nodes) ||
        r.worldSize != first.worldSize ||
        r.masterAddr != first.masterAddr || r.masterPort != first.masterPort) {
      return "members disagree on round " + std::to_string(first.round) +
             " (round, membership, world size or master)";
    }
    if (r.nodeRank < 0 || r.nodeRank >= n) return "node rank " + std::to_string(r.nodeRank) + " out of range";
    if (seen[r.nodeRank]) return "node rank " + std::to_string(r.nodeRank) + " held twice";
    seen[r.nodeRank] = true;
    if (r.worldSize != world) return "world size " + std::to_string(r.worldSize) + " != " + std::to_string(world);
    if (r.rankOffset != offset[r.nodeRank]) return "rank offset of node rank " + std::to_string(r.nodeRank) + " is wrong";
  }
  if (first.masterAddr != nodes[0].addr || first.masterPort != nodes[0].masterPort)
    return "MASTER_ADDR:PORT is not node rank 0's";
  return "";
}

std::vector<NodeInfo> membersOfRound(const TcpStoreOptions& store, const std::string& runId,
                                     const JobLimits& limits, int64_t round) {
  PrefixStore conn("ddprun/rdzv/" + runId, std::make_shared<TcpStore>(store));
  return membersOfRound(conn, limits, round);
}

std::vector<NodeInfo> membersOfRound(Store& conn, const JobLimits& limits, int64_t round) {
  StateLog log(conn, limits);
  const auto v = log.waitMarker(closedKey(round), Millis(0));
  if (!v) throw StoreError("round " + std::to_string(round) + " never closed");
  Versioned closed = log.read(*v);
  log.hydrate(closed.state);
  return closed.state.members;
}

Cost costOf(std::vector<StoreTraffic::Snapshot> v) {
  Cost c;
  if (v.empty()) return c;
  std::vector<int64_t> rt, by;
  for (const auto& s : v) {
    rt.push_back(s.roundTrips);
    by.push_back(s.bytes);
  }
  std::sort(rt.begin(), rt.end());
  std::sort(by.begin(), by.end());
  c.medianRoundTrips = rt[rt.size() / 2];
  c.maxRoundTrips = rt.back();
  c.medianBytes = by[by.size() / 2];
  c.maxBytes = by.back();
  return c;
}

namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

constexpr Millis kForever{86'400'000};  // until the end of the run

// 127.1.x.y: distinct advertised addresses (never bound), so ranks follow address order.
std::string agentAddr(int i) {
  return "127.1." + std::to_string(i / 250) + "." + std::to_string(1 + i % 250);
}

// One simulated agent: a fiber running the real DynamicRendezvous (its watcher a fiber too).
struct SimAgent {
  std::shared_ptr<StoreTraffic> traffic = std::make_shared<StoreTraffic>();
  std::unique_ptr<DynamicRendezvous> rdzv;
  std::string id;
  RoundInfo first, second;
  Clock::time_point formedAt, reformedAt;
  StoreTraffic::Snapshot atStart, atFormed, atReformed;
  std::string error;       // written by the agent's fiber before it counts itself
  bool superseded = false;  // its round 1 ended (its watcher's event); the agent parks on &agent
  // SwarmOptions::waiting: sampled by the harness once every waiting agent registered (atWaited)
  // and once round 2 re-formed (atEnd: for an agent left on round 2's waiting list).
  StoreTraffic::Snapshot atWaited, atEnd;
};

}  // namespace

namespace {

// A ddprun-store process; agents' connections counted (CountingBackend), no heartbeats.
class TcpSwarmStore final : public SwarmStore {
 public:
  TcpSwarmStore(const std::string& binary, Millis timeout)
      : process_(binary),
        options_{.host = "127.0.0.1", .port = process_.port(), .timeout = timeout,
                 .connectTimeout = timeout} {}
  std::shared_ptr<const RendezvousBackend> backend(std::shared_ptr<StoreTraffic> traffic,
                                                   bool slotJoin) const override {
    return std::make_shared<CountingBackend>(options_, HeartbeatOptions{.interval = Millis(0)},
                                             std::move(traffic), slotJoin);
  }
  std::shared_ptr<Store> connect(const std::string& runId) const override {
    return std::make_shared<PrefixStore>("ddprun/rdzv/" + runId,
                                         std::make_shared<TcpStore>(options_));
  }
  TcpStoreOptions storeOptions() const override { return options_; }
  double cpuSeconds() const override { return process_.cpuSeconds(); }

 private:
  StoreProcess process_;
  TcpStoreOptions options_;
};

}  // namespace

SwarmResult runSwarm(const std::string& storeBinary, const SwarmOptions& o) {
  if (o.protocol == "slots") return runSlotSwarm(storeBinary, o);
  raiseFileLimit();
  TcpSwarmStore store(storeBinary, o.timeout);
  return runSwarmOn(store, o);
}

SwarmResult runSwarmOn(const SwarmStore& store, const SwarmOptions& o) {
  const int n = o.agents;
  const JobLimits limits{.minNodes = std::max(1, n - 1), .maxNodes = n, .maxRestarts = 0};
  const std::string runId = "simulate" + std::to_string(n) + "-" + std::to_string(::getpid());
  const TcpStoreOptions storeOptions = store.storeOptions();

  std::mt19937_64 rng(o.seed);
  std::vector<Millis> arrival(n);
  std::vector<int> nproc(n);
  for (int i = 0; i < n; ++i) {
    arrival[i] = Millis(o.spread.count() > 0 ? static_cast<int64_t>(rng() % o.spread.count()) : 0);
    nproc[i] = 1 + static_cast<int>(rng() % std::max(1, o.maxNproc));
  }
  const int victim = static_cast<int>(rng() % n);
  // SwarmOptions::waiting: agents n.. arrive at the full round 1 once it formed.
  const int w = std::max(0, o.waiting);
  const int total = n + w;
  for (int i = 0; i < w; ++i) {
    arrival.push_back(Millis(0));
    nproc.push_back(1 + static_cast<int>(rng() % std::max(1, o.maxNproc)));
  }
  // Round 2: MAX members (the survivors and the first waiting nodes to take a slot); the rest
  // wait on its list.
  const int members2 = std::min(n - 1 + w, n);
  const int queued2 = n - 1 + w - members2;

  std::vector<SimAgent> agents(total);
  // The agents are fibers of `pool` (agent i on scheduler i % o.loops, each run by a thread of
  // its own); the main thread waits on `cv` for the counts and wakes the fibers by posting.
  FiberPool pool(o.loops);
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> go{false};    // the first arrival's time has come (fibers park on &go)
  std::atomic<bool> done{false};  // the end of the run (each agent's fiber parks on its agent)
  std::atomic<bool> go2{false};    // round 1 formed: the waiting agents arrive (park on &go2)
  std::atomic<bool> ending{false};  // the harness ends the job: a JobEndedError is no error
  // Counted without the lock; the one that reaches the target takes it to notify, so the main
  // thread's predicate cannot miss the wake-up.
  std::atomic<int> formed{0}, reformed{0};
  Clock::time_point t0;
  auto count = [&](std::atomic<int>& counter, int target) {
    if (counter.fetch_add(1) + 1 != target) return;
    std::lock_guard<std::mutex> g(mu);
    cv.notify_all();
  };
  // Parks agent `a`'s fiber until `ready()` or the end of the run; false after `timeout`.
  auto sleepUntil = [&](FiberScheduler& fibers, SimAgent& a, Millis timeout, auto ready) {
    const auto deadline = timeout == kForever ? Clock::time_point::max() : Clock::now() + timeout;
    while (!ready() && !done) {
      if (!fibers.park(nullptr, &a, deadline)) return ready() || done.load();
    }
    return true;
  };

  // Connecting is not timed: each agent connects (TCP, HELLO) and checks the job's settings
  // (the DynamicRendezvous constructor: one compare-set, counted in its round trips) before the
  // first arrival, at most kConnecting at a time. A 10,000-node job's agents start on their own
  // machines, whose connects reach the store's host spread by their start-up; 10,000 connects
  // from one process within 200 ms overflow the accept queue (somaxconn, 4096 here) and each
  // dropped SYN costs its client a 1 s retransmission -- a cost of this machine's kernel, not
  // of the protocol. `connectSeconds` times this phase (reported, not counted in the form time).
  constexpr int kConnecting = 256;
  // Per scheduler (its fibers park on its entry for one).
  std::vector<int> connectSlots(o.loops, std::max(1, kConnecting / o.loops));
  std::atomic<int> ready{0};  // agents connected (or failed to)
  auto body = [&](int i) {
    SimAgent& a = agents[i];
    FiberScheduler& fibers = pool.of(i);
    int& slots = connectSlots[i % o.loops];
    bool counted = false;   // in `formed`
    bool isReady = false;   // in `ready`
    try {
      while (slots == 0) fibers.park(nullptr, &slots, Clock::time_point::max());
      --slots;
      struct Release {
        FiberScheduler& f;
        int& slots;
        ~Release() {
          ++slots;
          f.wake(&slots);
        }
      };
      {
        Release release{fibers, slots};
        DynamicRendezvousOptions opt;
        opt.runId = runId;
        opt.backend = store.backend(a.traffic, /*slotJoin=*/o.protocol == "agents");
        opt.store = storeOptions;
        opt.limits = limits;
        opt.localAddr = agentAddr(i);
        opt.nproc = nproc[i];
        opt.joinTimeout = o.timeout;
        opt.lastCallTimeout = o.timeout;  // round 1 closes at MAX, round 2 when every survivor is back
        opt.heartbeat = {.interval = Millis(0)};
        opt.watcherOnAgentConnection = true;  // one connection per agent
        opt.arrivalRanks = o.arrivalRanks;
        a.atStart = a.traffic->snapshot();
        // The watcher's event, on the watcher's fiber: wakes this agent's.
        a.rdzv = std::make_unique<DynamicRendezvous>(opt, [&a, &fibers](const RoundEvent& e) {
          if (e.kind != RoundEvent::Kind::Superseded) return;
          a.superseded = true;
          fibers.wake(&a);
        });
        a.id = a.rdzv->self().id;
      }
      isReady = true;
      count(ready, total);
      if (i >= n) {  // a waiting agent: arrives at the full round 1, re-forms in round 2 or waits
        while (!go2 && !done) fibers.park(nullptr, &go2, Clock::time_point::max());
        if (done) throw Error("the run ended before this agent's arrival");
        counted = true;
        a.atFormed = a.atStart;
        a.second = a.rdzv->nextRound();
        a.reformedAt = Clock::now();
        a.atReformed = a.traffic->snapshot();
        count(reformed, members2);
        sleepUntil(fibers, a, kForever, [] { return false; });
        a.rdzv.reset();
        return;
      }
      while (!go) fibers.park(nullptr, &go, Clock::time_point::max());
      if (done) throw Error("the run ended before this agent's arrival");
      fibers.sleepUntil(t0 + arrival[i]);
      a.first = a.rdzv->nextRound();
      a.formedAt = Clock::now();
      a.atFormed = a.traffic->snapshot();
      counted = true;
      count(formed, n);
      if (i == victim) {
        sleepUntil(fibers, a, kForever, [] { return false; });
      } else if (!sleepUntil(fibers, a, o.timeout, [&] { return a.superseded; })) {
        a.error = "round " + std::to_string(a.first.round) + " never ended";
        count(reformed, members2);
      } else if (!done) {
        a.second = a.rdzv->nextRound();
        a.reformedAt = Clock::now();
        a.atReformed = a.traffic->snapshot();
        count(reformed, members2);
        sleepUntil(fibers, a, kForever, [] { return false; });
      }
    } catch (const JobEndedError&) {
      if (!ending) {
        a.error = "the job ended";
        count(reformed, members2);
      }
    } catch (const std::exception& e) {
      a.error = e.what();
      if (!isReady) count(ready, total);  // so that the swarm does not wait for it
      if (!counted) count(formed, n);  // counted (with an error), so the swarm does not wait for it
      count(reformed, members2);
    }
    a.rdzv.reset();  // on its fiber: the destructor joins the watcher's fiber
  };

  SwarmResult r;
  const auto tConnect = Clock::now();  // set-up: the agents' fibers, connections, settings check
  for (int i = 0; i < total; ++i) pool.spawn(i, [&body, i] { body(i); });
  pool.start();
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, 2 * o.timeout, [&] { return ready >= total; });
    if (ready < total) r.error = std::to_string(total - ready.load()) + " agents did not connect";
  }
  r.connectSeconds = seconds(Clock::now() - tConnect);
  const double cpu0 = store.cpuSeconds();
  const double self0 = StoreProcess::cpuSecondsOf(::getpid());
  t0 = Clock::now();  // published to the fibers by `go`
  go = true;
  pool.postAll([&](FiberScheduler& f) { f.wake(&go); });

  auto firstError = [&]() -> std::string {
    for (int i = 0; i < total; ++i)
      if (!agents[i].error.empty()) return "agent " + std::to_string(i) + ": " + agents[i].error;
    return "";
  };
  // Every agent's fiber ends (its DynamicRendezvous and watcher with it) before the store goes.
  auto finish = [&] {
    if (w > 0) {
      // Agents still waiting for a place hold a join: the harness ends the job (Failed, on the
      // closed round 2) so that every waiting agent's join returns.
      ending = true;
      try {
        auto conn = store.connect(runId);
        StateLog log(*conn, limits, /*spill=*/true);
        const Versioned v = log.refresh(log.latest());
        if (v.state.phase == Phase::Closed) {
          const auto m = membersOfRound(*conn, limits, v.state.round);
          failNode(log, v, v.state.round, m.at(0).id, 1, "the simulation is over", true);
        }
      } catch (const std::exception& e) {
        if (r.error.empty()) r.error = std::string("ending the job: ") + e.what();
      }
    }
    done = true;
    go = true;
    go2 = true;
    pool.postAll([&](FiberScheduler& f) {
      f.wake(&go);
      f.wake(&go2);
      for (auto& a : agents) f.wake(&a);  // each scheduler wakes its own
    });
    pool.join();
    agents.clear();
  };

  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, o.timeout + o.spread + Millis(5'000), [&] { return formed >= n; });
    if (formed < n && r.error.empty())
      r.error = std::to_string(n - formed.load()) + " agents' round 1 did not close";
  }
  if (r.error.empty()) r.error = firstError();
  if (!r.error.empty()) {
    finish();
    return r;
  }
  std::vector<RoundInfo> rounds;
  std::vector<StoreTraffic::Snapshot> cost;
  Clock::time_point last = t0, firstDone = Clock::time_point::max();
  for (int i = 0; i < n; ++i) {
    const SimAgent& a = agents[i];
    rounds.push_back(a.first);
    cost.push_back(a.atFormed - a.atStart);
    last = std::max(last, a.formedAt);
    firstDone = std::min(firstDone, a.formedAt);
  }
  if (o.corruptView && n >= 2) rounds[0].nodeRank = rounds[1].nodeRank;
  std::vector<NodeInfo> members;
  try {
    members = membersOfRound(*store.connect(runId), limits, rounds[0].round);
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  if (r.error.empty()) r.error = checkRound(rounds, &members);
  if (!r.error.empty()) {
    finish();
    return r;
  }
  r.formSeconds = seconds(last - t0);
  r.formFirstSeconds = seconds(firstDone - t0);
  {
    std::error_code ec;
    for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end;
         it.increment(ec))
      ++r.descriptorsFormed;
  }
  r.formStoreCpu = store.cpuSeconds() - cpu0;
  r.formSwarmCpu = StoreProcess::cpuSecondsOf(::getpid()) - self0;
  r.form = costOf(cost);
  const int64_t round1 = rounds[0].round, round2 = round1 + 1;  // the protocol's round numbers

  // SwarmOptions::waiting: the waiting agents arrive at the full round 1, all at once; each
  // registers on its waiting list (no version written) and waits.
  if (w > 0) {
    const auto tWait = Clock::now();
    go2 = true;
    pool.postAll([&](FiberScheduler& f) { f.wake(&go2); });
    try {
      auto conn = store.connect(runId);
      StateLog log(*conn, limits, /*spill=*/true);
      const Versioned closed = log.refresh(log.latest());
      const auto deadline = Clock::now() + o.timeout;
      int64_t k = 0;
      while ((k = scalable::readWaitingCount(*conn, round1)) < w && Clock::now() < deadline &&
             firstError().empty())
        std::this_thread::sleep_for(Millis(2));
      r.waitSeconds = seconds(Clock::now() - tWait);
      if (k != w) {
        r.error = "round 1's waiting list counts " + std::to_string(k) + " of " +
                  std::to_string(w) + " waiting agents";
      } else if (log.refresh(closed).version != closed.version) {
        r.error = "the waiting agents wrote a state version (" + std::to_string(closed.version) +
                  " -> " + std::to_string(log.refresh(closed).version) + ")";
      }
    } catch (const std::exception& e) {
      r.error = std::string("waiting list: ") + e.what();
    }
    if (r.error.empty()) r.error = firstError();
    if (!r.error.empty()) {
      finish();
      return r;
    }
    cost.clear();
    for (int i = n; i < total; ++i) {
      agents[i].atWaited = agents[i].traffic->snapshot();  // parked on round/1/over
      cost.push_back(agents[i].atWaited - agents[i].atStart);
    }
    r.wait = costOf(cost);
  }

  // The victim is dead: evicted as its heartbeat watcher would (one compare-set).
  const double cpu1 = store.cpuSeconds();
  const double self1 = StoreProcess::cpuSecondsOf(::getpid());
  Clock::time_point tEvict;
  try {
    auto evictTraffic = std::make_shared<StoreTraffic>();
    auto conn = std::make_shared<CountingStore>(store.connect(runId), evictTraffic);
    StateLog log(*conn, limits, /*spill=*/o.protocol == "agents");
    const std::string why = "node " + agents[victim].id + " simulated lost";
    const Versioned newest = log.refresh(log.latest());  // a watcher holds it (its StateView)
    const auto before = evictTraffic->snapshot();
    auto ev = removeNode(log, newest, agents[victim].id, why);
    tEvict = Clock::now();
    r.evictor = costOf({evictTraffic->snapshot() - before});
    if (!ev.wrote) r.error = "the eviction of " + agents[victim].id + " wrote nothing";
  } catch (const std::exception& e) {
    r.error = std::string("eviction: ") + e.what();
  }
  if (r.error.empty()) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, o.timeout + Millis(5'000), [&] { return reformed >= members2; });
    if (reformed < members2)
      r.error = std::to_string(members2 - reformed.load()) + " agents did not re-form";
  }
  // The agents left out of round 2 (slots beyond MAX) are on its waiting list.
  std::set<std::string> queued;
  if (r.error.empty() && queued2 > 0) {
    try {
      auto conn = store.connect(runId);
      const auto deadline = Clock::now() + o.timeout;
      int64_t k = 0;
      while ((k = scalable::readWaitingCount(*conn, round2)) < queued2 && Clock::now() < deadline &&
             firstError().empty())
        std::this_thread::sleep_for(Millis(2));
      if (k != queued2) {
        r.error = "round 2's waiting list counts " + std::to_string(k) + " of " +
                  std::to_string(queued2) + " agents left out";
      } else {
        std::vector<std::string> keys;
        for (int64_t i = 0; i < k; ++i) keys.push_back(listKey(waitingListRef(round2), i));
        for (const auto& node : decodeNodeLines(conn->multiGet(keys), RoundState::List::Waiting,
                                                "round 2's waiting list"))
          if (!queued.insert(node.id).second) r.error = node.id + " waits twice in round 2";
      }
    } catch (const std::exception& e) {
      r.error = std::string("round 2's waiting list: ") + e.what();
    }
  }
  if (r.error.empty()) r.error = firstError();
  if (r.error.empty()) {
    rounds.clear();
    cost.clear();
    last = tEvict;
    firstDone = Clock::time_point::max();
    std::set<std::string> inRound;
    for (int i = 0; i < total; ++i) {
      if (i == victim) continue;
      SimAgent& a = agents[i];
      const StoreTraffic::Snapshot from = i >= n ? a.atWaited : a.atFormed;
      if (a.second.round == 0) {  // left out: on round 2's waiting list (checked below)
        if (!queued.count(a.id)) r.error = "agent " + a.id + " is neither in round 2 nor waiting";
        a.atEnd = a.traffic->snapshot();
        cost.push_back(a.atEnd - from);
        continue;
      }
      if (queued.count(a.id)) r.error = "agent " + a.id + " is in round 2 and waits for it";
      inRound.insert(a.id);
      rounds.push_back(a.second);
      cost.push_back(a.atReformed - from);
      last = std::max(last, a.reformedAt);
      firstDone = std::min(firstDone, a.reformedAt);
    }
    try {
      if (r.error.empty()) members = membersOfRound(*store.connect(runId), limits, rounds[0].round);
    } catch (const std::exception& e) {
      r.error = e.what();
    }
    if (r.error.empty()) r.error = checkRound(rounds, &members);
    if (r.error.empty() && static_cast<int>(members.size()) != members2)
      r.error = "the re-formed round has " + std::to_string(members.size()) + " members";
    if (r.error.empty() && static_cast<int>(inRound.size() + queued.size()) != total - 1)
      r.error = "a live agent is lost: " + std::to_string(inRound.size()) + " in round 2, " +
                std::to_string(queued.size()) + " waiting, of " + std::to_string(total - 1);
    if (r.error.empty()) {
      r.reformSeconds = seconds(last - tEvict);
      r.reformFirstSeconds = seconds(firstDone - tEvict);
      r.reformStoreCpu = store.cpuSeconds() - cpu1;
      r.reformSwarmCpu = StoreProcess::cpuSecondsOf(::getpid()) - self1;
      r.reform = costOf(cost);
    }
  }
  finish();
  return r;
}

}  // namespace ddprun::bench
