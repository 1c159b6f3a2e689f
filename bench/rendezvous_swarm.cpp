#include "bench/rendezvous_swarm.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "base/errors.h"
#include "rendezvous/prefix_store.h"
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
  const int rc = ::posix_spawn(&pid_, a[0], &fa, nullptr, a.data(), e.data());
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

double StoreProcess::cpuSeconds() const {
  std::ifstream in("/proc/" + std::to_string(pid_) + "/stat");
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

// 127.1.x.y: distinct advertised addresses (never bound), so ranks follow address order.
std::string agentAddr(int i) {
  return "127.1." + std::to_string(i / 250) + "." + std::to_string(1 + i % 250);
}

// One simulated agent: a thread running the real DynamicRendezvous.
struct SimAgent {
  std::shared_ptr<StoreTraffic> traffic = std::make_shared<StoreTraffic>();
  std::unique_ptr<DynamicRendezvous> rdzv;
  std::string id;
  RoundInfo first, second;
  Clock::time_point formedAt, reformedAt;
  StoreTraffic::Snapshot atStart, atFormed, atReformed;
  std::string error;
  bool superseded = false;  // guarded by the swarm's mutex
  bool formed = false;      // likewise
};

}  // namespace

SwarmResult runSwarm(const std::string& storeBinary, const SwarmOptions& o) {
  if (o.protocol == "slots") return runSlotSwarm(storeBinary, o);
  raiseFileLimit();
  StoreProcess store(storeBinary);
  const int n = o.agents;
  const JobLimits limits{.minNodes = std::max(1, n - 1), .maxNodes = n, .maxRestarts = 0};
  const std::string runId = "simulate" + std::to_string(n) + "-" + std::to_string(::getpid());
  TcpStoreOptions storeOptions{.host = "127.0.0.1", .port = store.port(), .timeout = o.timeout,
                               .connectTimeout = o.timeout};

  std::mt19937_64 rng(o.seed);
  std::vector<Millis> arrival(n);
  std::vector<int> nproc(n);
  for (int i = 0; i < n; ++i) {
    arrival[i] = Millis(o.spread.count() > 0 ? static_cast<int64_t>(rng() % o.spread.count()) : 0);
    nproc[i] = 1 + static_cast<int>(rng() % std::max(1, o.maxNproc));
  }
  const int victim = static_cast<int>(rng() % n);

  std::vector<SimAgent> agents(n);
  std::mutex mu;
  std::condition_variable cv;
  bool go = false, done = false;
  int formed = 0, reformed = 0;
  Clock::time_point t0;

  auto body = [&](int i) {
    SimAgent& a = agents[i];
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return go; });
    }
    std::this_thread::sleep_until(t0 + arrival[i]);
    try {
      DynamicRendezvousOptions opt;
      opt.runId = runId;
      opt.backend = std::make_shared<CountingBackend>(
          storeOptions, HeartbeatOptions{.interval = Millis(0)}, a.traffic,
          /*slotJoin=*/o.protocol == "agents");
      opt.store = storeOptions;
      opt.limits = limits;
      opt.localAddr = agentAddr(i);
      opt.nproc = nproc[i];
      opt.joinTimeout = o.timeout;
      opt.lastCallTimeout = o.timeout;  // round 1 closes at MAX, round 2 when every survivor is back
      opt.heartbeat = {.interval = Millis(0)};
      a.atStart = a.traffic->snapshot();
      a.rdzv = std::make_unique<DynamicRendezvous>(opt, [&, i](const RoundEvent& e) {
        if (e.kind != RoundEvent::Kind::Superseded) return;
        {
          std::lock_guard<std::mutex> g(mu);
          agents[i].superseded = true;
        }
        cv.notify_all();
      });
      a.id = a.rdzv->self().id;
      a.first = a.rdzv->nextRound();
      a.formedAt = Clock::now();
      a.atFormed = a.traffic->snapshot();
      std::unique_lock<std::mutex> lock(mu);
      a.formed = true;
      ++formed;
      cv.notify_all();
      if (i == victim) {
        cv.wait(lock, [&] { return done; });
        return;
      }
      if (!cv.wait_for(lock, o.timeout, [&] { return a.superseded || done; }) || done) {
        if (!done) a.error = "round " + std::to_string(a.first.round) + " never ended";
        return;
      }
      lock.unlock();
      a.second = a.rdzv->nextRound();
      a.reformedAt = Clock::now();
      a.atReformed = a.traffic->snapshot();
      lock.lock();
      ++reformed;
      cv.notify_all();
      cv.wait(lock, [&] { return done; });
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> g(mu);
      a.error = e.what();
      if (!a.formed) ++formed;  // counted (with an error), so the swarm does not wait for it
      ++reformed;
      cv.notify_all();
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int i = 0; i < n; ++i) threads.emplace_back(body, i);
  const double cpu0 = store.cpuSeconds();
  {
    std::lock_guard<std::mutex> g(mu);
    t0 = Clock::now();
    go = true;
  }
  cv.notify_all();

  SwarmResult r;
  auto firstError = [&]() -> std::string {
    for (int i = 0; i < n; ++i)
      if (!agents[i].error.empty()) return "agent " + std::to_string(i) + ": " + agents[i].error;
    return "";
  };
  auto finish = [&] {
    {
      std::lock_guard<std::mutex> g(mu);
      done = true;
    }
    cv.notify_all();
    for (auto& t : threads) t.join();
    agents.clear();  // stops every agent's watcher before the store goes
  };

  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, o.timeout + o.spread + Millis(5'000), [&] { return formed == n; });
    if (formed != n) r.error = std::to_string(n - formed) + " agents' round 1 did not close";
  }
  if (r.error.empty()) r.error = firstError();
  if (!r.error.empty()) {
    finish();
    return r;
  }
  std::vector<RoundInfo> rounds;
  std::vector<StoreTraffic::Snapshot> cost;
  Clock::time_point last = t0;
  for (auto& a : agents) {
    rounds.push_back(a.first);
    cost.push_back(a.atFormed - a.atStart);
    last = std::max(last, a.formedAt);
  }
  std::vector<NodeInfo> members;
  try {
    members = membersOfRound(storeOptions, runId, limits, rounds[0].round);
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  if (r.error.empty()) r.error = checkRound(rounds, &members);
  if (!r.error.empty()) {
    finish();
    return r;
  }
  r.formSeconds = seconds(last - t0);
  r.formStoreCpu = store.cpuSeconds() - cpu0;
  r.form = costOf(cost);

  // The victim is dead: evicted as its heartbeat watcher would (one compare-set).
  const double cpu1 = store.cpuSeconds();
  Clock::time_point tEvict;
  try {
    PrefixStore conn("ddprun/rdzv/" + runId, std::make_shared<TcpStore>(storeOptions));
    StateLog log(conn, limits, /*spill=*/o.protocol == "agents");
    const std::string why = "node " + agents[victim].id + " simulated lost";
    auto w = log.update(log.refresh(log.latest()), [&](const RoundState& s) {
      return transition::remove(s, agents[victim].id, why, limits);
    });
    tEvict = Clock::now();
    if (!w.wrote) r.error = "the eviction of " + agents[victim].id + " wrote nothing";
  } catch (const std::exception& e) {
    r.error = std::string("eviction: ") + e.what();
  }
  if (r.error.empty()) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, o.timeout + Millis(5'000), [&] { return reformed == n - 1; });
    if (reformed != n - 1) r.error = std::to_string(n - 1 - reformed) + " survivors did not re-form";
  }
  if (r.error.empty()) r.error = firstError();
  if (r.error.empty()) {
    rounds.clear();
    cost.clear();
    last = tEvict;
    for (int i = 0; i < n; ++i) {
      if (i == victim) continue;
      rounds.push_back(agents[i].second);
      cost.push_back(agents[i].atReformed - agents[i].atFormed);
      last = std::max(last, agents[i].reformedAt);
    }
    try {
      members = membersOfRound(storeOptions, runId, limits, rounds[0].round);
    } catch (const std::exception& e) {
      r.error = e.what();
    }
    if (r.error.empty()) r.error = checkRound(rounds, &members);
    if (r.error.empty() && static_cast<int>(members.size()) != n - 1)
      r.error = "the re-formed round has " + std::to_string(members.size()) + " members";
    if (r.error.empty()) {
      r.reformSeconds = seconds(last - tEvict);
      r.reformStoreCpu = store.cpuSeconds() - cpu1;
      r.reform = costOf(cost);
    }
  }
  finish();
  return r;
}

}  // namespace ddprun::bench
