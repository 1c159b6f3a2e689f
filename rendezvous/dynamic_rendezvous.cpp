#include "rendezvous/dynamic_rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <random>
#include <sstream>

#include "rendezvous/errors.h"
#include "rendezvous/log.h"
#include "rendezvous/node_address.h"
#include "rendezvous/prefix_store.h"

namespace ddprun::rendezvous {

namespace {

constexpr Millis kWatchSlice{3'600'000};  // a watcher's WAIT is re-armed after this long

bool hasSpace(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); });
}

std::string randomHex(int digits) {
  std::random_device rd;
  std::uniform_int_distribution<int> d(0, 15);
  std::string s;
  for (int i = 0; i < digits; ++i) s += "0123456789abcdef"[d(rd)];
  return s;
}

Millis until(Clock::time_point t) {
  return std::chrono::duration_cast<Millis>(t - Clock::now());
}

std::string seconds(Millis m) {
  std::ostringstream os;
  os << m.count() / 1000.0 << " s";
  return os.str();
}

std::string passedKey(int64_t round, int rank) {
  return "round/" + std::to_string(round) + "/passed/" + std::to_string(rank);
}

}  // namespace

struct DynamicRendezvous::Connection {
  std::shared_ptr<TcpStore> tcp;
  std::shared_ptr<Store> store;  // the job's keys: PrefixStore over tcp
};

std::unique_ptr<DynamicRendezvous::Connection> DynamicRendezvous::connect() const {
  auto c = std::make_unique<Connection>();
  c->tcp = std::make_shared<TcpStore>(options_.store);
  c->store = std::make_shared<PrefixStore>("ddprun/rdzv/" + options_.runId, c->tcp);
  return c;
}

DynamicRendezvous::DynamicRendezvous(DynamicRendezvousOptions options, EventFn onEvent)
    : options_(std::move(options)), onEvent_(std::move(onEvent)) {
  const auto& lim = options_.limits;
  if (options_.runId.empty() || hasSpace(options_.runId) ||
      options_.runId.find('/') != std::string::npos) {
    throw ConfigError("--rdzv-id='" + options_.runId +
                      "' is not valid (allowed: a non-empty id without spaces or '/')");
  }
  if (lim.minNodes < 1 || lim.maxNodes < lim.minNodes) {
    throw ConfigError("--nnodes=" + std::to_string(lim.minNodes) + ":" +
                      std::to_string(lim.maxNodes) + " is not valid (allowed: 1 <= MIN <= MAX)");
  }
  if (options_.nproc < 1) throw ConfigError("nproc must be at least 1");
  if (options_.localAddr.empty())
    options_.localAddr = addressToward(options_.store.host, options_.store.port);
  if (hasSpace(options_.localAddr))
    throw ConfigError("--local-addr='" + options_.localAddr + "' contains white space");

  self_.addr = options_.localAddr;
  self_.id = options_.localAddr + "-" + std::to_string(::getpid()) + "-" + randomHex(6);
  self_.nproc = options_.nproc;
  self_.fixedRank = options_.fixedRank;

  main_ = connect();
  log_ = std::make_unique<StateLog>(*main_->store, lim);
  checkSettings();
  // The background threads connect on their own threads, off the join's critical path.
  if (options_.heartbeat.interval.count() > 0) {
    auto onError = [this](std::exception_ptr e) { onBackgroundError(e); };
    auto connectOne = [this] {
      std::shared_ptr<Connection> c = connect();
      return InterruptibleStore{c->store, [c] { c->tcp->interrupt(); },
                                [c] { c->tcp->cancelCall(); }};
    };
    writer_ = std::make_unique<HeartbeatWriter>(connectOne, *main_->store, self_.id,
                                                options_.heartbeat, onError);
    monitor_ = std::make_unique<HeartbeatMonitor>(connectOne, self_.id, options_.heartbeat, lim,
                                                  view_, onError);
  }
  watcher_ = std::thread([this] { watcherLoop(); });
  DDPRUN_LOG(INFO, "rendezvous") << "node " << self_.id << " joined rendezvous '"
                                 << options_.runId << "' at " << main_->tcp->address();
}

DynamicRendezvous::~DynamicRendezvous() {
  {
    std::lock_guard<std::mutex> g(mu_);  // the watcher publishes its connection under mu_
    stopping_ = true;
    if (watcherConn_) watcherConn_->tcp->interrupt();
  }
  cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  monitor_.reset();
  writer_.reset();
}

// Every node of a job must agree on its bounds and budget; a mismatch is a configuration
// error, reported before this node takes part.
void DynamicRendezvous::checkSettings() {
  const auto& lim = options_.limits;
  std::string mine = "nnodes=" + std::to_string(lim.minNodes) + ":" +
                     std::to_string(lim.maxNodes) +
                     " max_restarts=" + std::to_string(lim.maxRestarts) +
                     " backend=" + (options_.fixedRank >= 0 ? "static" : "c10d");
  std::string theirs = main_->store->compareSet("settings", "", mine);
  if (theirs != mine) {
    throw ConfigError("rendezvous '" + options_.runId + "' at " + main_->tcp->address() +
                      ": this node has " + mine + " but the job's other nodes have " + theirs +
                      ": give every node the same --nnodes, --max-restarts and --rdzv-backend");
  }
}

void DynamicRendezvous::interrupt() {
  std::lock_guard<std::mutex> g(mainMu_);
  interrupted_ = true;
  main_->tcp->interrupt();
}

// Only the agent's thread replaces main_ (under mainMu_); it reads main_ without the lock.
void DynamicRendezvous::reconnectIfInterrupted() {
  if (!interrupted_.exchange(false)) return;
  auto fresh = connect();
  auto log = std::make_unique<StateLog>(*fresh->store, options_.limits);
  std::lock_guard<std::mutex> g(mainMu_);
  std::swap(main_, fresh);
  std::swap(log_, log);
}

Versioned DynamicRendezvous::fresh() {
  Versioned seen = view_.get();
  if (seen.version > current_.version) current_ = seen;
  current_ = log_->refresh(current_);
  view_.offer(current_);
  return current_;
}

RoundInfo DynamicRendezvous::nextRound() {
  DDPRUN_CHECK(!left_, "nextRound() after leave()");
  reconnectIfInterrupted();
  watch(-1);
  inRound_ = false;
  self_.masterPort = pickFreePort();
  const Versioned closed = joinAndWait();
  round_ = roundInfo(closed.state);
  roundNo_ = round_.round;
  inRound_ = true;
  watch(round_.round);
  DDPRUN_LOG(INFO, "rendezvous")
      << "round " << round_.round << " closed: node rank " << round_.nodeRank << " of "
      << round_.nodeCount << ", ranks " << round_.rankOffset << ".."
      << round_.rankOffset + self_.nproc - 1 << " of " << round_.worldSize << ", master "
      << round_.masterAddr << ":" << round_.masterPort << ", restarts " << round_.restartCount;
  return round_;
}

// The loop of one join: take part, then WAIT on the marker that ends the current wait
// (closed, last_call, over), or on the next version when a marker would be stale.
Versioned DynamicRendezvous::joinAndWait() {
  const auto& lim = options_.limits;
  const auto joinDeadline = Clock::now() + options_.joinTimeout;
  std::map<int64_t, Clock::time_point> lastCallDeadline;  // per round, from when we saw MIN
  Versioned cur = fresh();
  for (;;) {
    current_ = cur;
    view_.offer(cur);
    const RoundState& s = cur.state;
    if (s.phase == Phase::Finished || s.phase == Phase::Failed) {
      transition::join(s, self_, lim);  // throws JobEndedError with the reason
    }
    if (until(joinDeadline).count() <= 0) {
      throw TimeoutError("rendezvous '" + options_.runId + "' at " + main_->tcp->address() +
                         ": round " + std::to_string(s.round) + " did not close within " +
                         "join_timeout=" + seconds(options_.joinTimeout) + " (" +
                         std::to_string(s.members.size()) + " node(s) joined, MIN=" +
                         std::to_string(lim.minNodes) + ", MAX=" + std::to_string(lim.maxNodes) +
                         ")");
    }
    const bool member = s.member(self_.id) != nullptr;
    const bool waiting = std::any_of(s.waiting.begin(), s.waiting.end(),
                                     [&](const NodeInfo& n) { return n.id == self_.id; });
    if (s.phase == Phase::Closed && member) return cur;
    if (s.phase == Phase::Closed && waiting) {  // the job is full: wait for a place
      if (auto v = log_->waitMarker(overKey(s.round), until(joinDeadline))) cur = log_->read(*v);
      continue;
    }
    if (!member) {
      cur = log_->update(cur, [&](const RoundState& st) {
        return transition::join(st, self_, lim);
      }).now;
      continue;
    }
    // A member of a joining round.
    if (static_cast<int>(s.members.size()) >= lim.minNodes) {
      auto it =
          lastCallDeadline.try_emplace(s.round, Clock::now() + options_.lastCallTimeout).first;
      const auto wakeAt = std::min(it->second, joinDeadline);
      if (auto v = log_->waitMarker(closedKey(s.round), until(wakeAt))) {
        cur = log_->read(*v);
        continue;
      }
      if (Clock::now() < it->second) continue;  // the join deadline: reported above
      auto r = log_->update(cur, [&](const RoundState& st) {
        return transition::closeAtDeadline(st, s.round, lim);
      });
      cur = r.now;
      if (r.wrote || cur.state.round != s.round || cur.state.phase != Phase::Joining ||
          static_cast<int>(cur.state.members.size()) >= lim.minNodes) {
        continue;
      }
      // Below MIN again (a node left after the last call began): fall through.
    }
    // Below MIN: wait for the last call, unless that marker is older news than `cur`.
    auto lc = log_->waitMarker(lastCallKey(cur.state.round), until(joinDeadline));
    if (!lc) continue;
    if (*lc > cur.version) {
      cur = log_->read(*lc);
      continue;
    }
    if (auto nv = log_->waitNewer(cur, until(joinDeadline))) cur = *nv;
  }
}

RoundInfo DynamicRendezvous::roundInfo(const RoundState& s) const {
  RoundInfo r;
  r.round = s.round;
  r.restartCount = s.restarts;
  r.nodeRank = s.rankOf(self_.id);
  DDPRUN_CHECK(r.nodeRank >= 0, "node " << self_.id << " is not in round " << s.round);
  r.nodeCount = static_cast<int>(s.members.size());
  for (int i = 0; i < r.nodeCount; ++i) {
    if (i < r.nodeRank) r.rankOffset += s.members[i].nproc;
    r.worldSize += s.members[i].nproc;
  }
  r.masterAddr = s.members[0].addr;
  r.masterPort = s.members[0].masterPort;
  r.nodes = s.members;
  return r;
}

DynamicRendezvous::AfterFailure DynamicRendezvous::reportFailure(int exitCode,
                                                                const std::string& what) {
  DDPRUN_CHECK(inRound_, "reportFailure() outside a round");
  reconnectIfInterrupted();
  watch(-1);
  inRound_ = false;
  const std::string reason = "workers of node " + self_.id + " failed: " + what;
  auto r = log_->update(current_, [&](const RoundState& s) {
    return transition::failWorkers(s, round_.round, self_.id, exitCode, reason, options_.limits);
  });
  current_ = r.now;
  view_.offer(current_);
  if (r.now.state.phase == Phase::Failed) {
    jobExitCode_ = r.now.state.exitCode;
    jobFailure_ = r.now.state.reason;
    return AfterFailure::JobFailed;
  }
  if (!r.wrote) {
    DDPRUN_LOG(INFO, "rendezvous") << "round " << round_.round
                                   << " had already ended; no restart spent";
  }
  return AfterFailure::Restart;
}

DynamicRendezvous::AfterSuccess DynamicRendezvous::finishRound() {
  DDPRUN_CHECK(inRound_, "finishRound() outside a round");
  reconnectIfInterrupted();
  watch(-1);
  inRound_ = false;
  const int64_t r = round_.round;
  auto& store = *main_->store;
  const int64_t done = store.add("round/" + std::to_string(r) + "/done", 1);
  if (done == 1) {
    // The first to finish: from now on a late node waits rather than making every node redo
    // finished work.
    current_ = log_->update(current_, [&](const RoundState& s) {
      return transition::beginFinish(s, r);
    }).now;
  }
  if (done == round_.nodeCount) {
    current_ = log_->update(current_, [&](const RoundState& s) {
      return transition::finish(s, r);
    }).now;
  }
  auto v = log_->waitMarker(overKey(r), options_.exitBarrierTimeout);
  if (!v) {
    throw TimeoutError("rendezvous '" + options_.runId + "': exit barrier of round " +
                       std::to_string(r) + ": only " + std::to_string(done) + " of " +
                       std::to_string(round_.nodeCount) + " nodes had finished when " +
                       "exit_barrier_timeout=" + seconds(options_.exitBarrierTimeout) +
                       " ran out");
  }
  current_ = log_->read(*v);
  view_.offer(current_);
  const RoundState& s = current_.state;
  if (s.phase == Phase::Failed) {
    jobExitCode_ = s.exitCode;
    jobFailure_ = s.reason;
    return AfterSuccess::JobFailed;
  }
  if (s.phase != Phase::Finished) return AfterSuccess::Rejoin;
  if (s.round == r) {
    store.set(passedKey(r, round_.nodeRank), "");
    if (options_.isHost) {
      // The store must outlive every node's last read of it (pytorch#118891).
      std::vector<std::string> keys;
      for (int i = 0; i < round_.nodeCount; ++i) keys.push_back(passedKey(r, i));
      try {
        store.wait(keys, options_.closeTimeout);
      } catch (const TimeoutError&) {
        DDPRUN_LOG(WARN, "rendezvous") << "not every node passed the exit barrier within "
                                       << "close_timeout=" << seconds(options_.closeTimeout);
      }
    }
  }
  // The job is over: stop beating; the keys die with the store (no round trips spent on them).
  if (monitor_) monitor_->stop();
  if (writer_) writer_->stop(false);
  return AfterSuccess::Finished;
}

void DynamicRendezvous::leave(const std::string& reason) {
  if (left_) return;
  reconnectIfInterrupted();
  watch(-1);
  left_ = true;
  inRound_ = false;
  if (monitor_) monitor_->stop();
  const std::string why = "node " + self_.id + " (" + self_.addr + ") left: " + reason;
  auto r = log_->update(fresh(), [&](const RoundState& s) {
    return transition::remove(s, self_.id, why, options_.limits);
  });
  current_ = r.now;
  if (writer_) writer_->stop(true);
  DDPRUN_LOG(INFO, "rendezvous") << why;
}

void DynamicRendezvous::watch(int64_t round) {
  {
    std::lock_guard<std::mutex> g(mu_);
    watchRound_ = round;
  }
  cv_.notify_all();
}

// Waits on `round/<r>/over` of the round the agent runs in, and tells the agent when it
// fires -- unless the agent has moved on (disarmed) by then.
void DynamicRendezvous::watcherLoop() {
  try {
    auto c = connect();
    std::lock_guard<std::mutex> g(mu_);
    if (stopping_) return;
    watcherConn_ = std::move(c);
  } catch (const Error&) {
    onBackgroundError(std::current_exception());
    return;
  }
  StateLog log(*watcherConn_->store, options_.limits);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || watchRound_ >= 0; });
    if (stopping_) return;
    const int64_t r = watchRound_;
    lock.unlock();
    Versioned ended;
    try {
      std::optional<int64_t> v;
      while (!v) v = log.waitMarker(overKey(r), kWatchSlice);
      ended = log.read(*v);
      view_.offer(ended);
    } catch (const Error&) {
      onBackgroundError(std::current_exception());
      return;
    }
    lock.lock();
    if (stopping_) return;
    if (watchRound_ != r) continue;  // the agent ended the round itself
    watchRound_ = -1;
    RoundEvent e;
    e.round = r;
    e.message = ended.state.reason;
    e.exitCode = ended.state.exitCode;
    e.kind = ended.state.phase == Phase::Failed ? RoundEvent::Kind::JobFailed
                                                : RoundEvent::Kind::Superseded;
    lock.unlock();
    DDPRUN_LOG(INFO, "rendezvous") << "round " << r << " is over: " << e.message;
    emit(e);
    lock.lock();
  }
}

void DynamicRendezvous::emit(const RoundEvent& e) {
  if (onEvent_) onEvent_(e);
}

void DynamicRendezvous::onBackgroundError(std::exception_ptr eptr) {
  std::string what;
  try {
    std::rethrow_exception(eptr);
  } catch (const std::exception& ex) {
    what = ex.what();
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stopping_ || storeLost_) return;
    storeLost_ = true;
  }
  RoundEvent e;
  e.kind = RoundEvent::Kind::StoreLost;
  e.round = roundNo_;
  e.message = "lost the rendezvous store at " + options_.store.host + ":" +
              std::to_string(options_.store.port) + ": " + what;
  DDPRUN_LOG(ERROR, "rendezvous") << e.message;
  emit(e);
}

}  // namespace ddprun::rendezvous
