#include "rendezvous/dynamic_rendezvous.h"

#include <unistd.h>

#include <algorithm>

#include "base/errors.h"
#include "base/log.h"
#include "rendezvous/auth.h"
#include "rendezvous/node_address.h"
#include "rendezvous/prefix_store.h"

namespace ddprun::rendezvous {

namespace {

constexpr Millis kWatchSlice{3'600'000};  // a watcher's WAIT is re-armed after this long

bool hasSpace(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); });
}

// From getrandom(2) (auth.h), not std::random_device: constructing one asks the CPU for
// RDRAND with CPUID, which traps to the hypervisor in a VM -- at every agent's start.
std::string randomHex(int digits) { return auth::randomId().substr(0, static_cast<size_t>(digits)); }

}  // namespace

InterruptibleStore DynamicRendezvous::connect() const {
  return options_.backend->connect(options_.runId);
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
  if (!options_.backend) {
    options_.backend = std::make_shared<TcpStoreBackend>(
        options_.store, options_.heartbeat, options_.fixedRank >= 0 ? "static" : "c10d");
  }
  if (options_.localAddr.empty()) options_.localAddr = options_.backend->localAddress();
  if (hasSpace(options_.localAddr))
    throw ConfigError("--local-addr='" + options_.localAddr + "' contains white space");

  self_.addr = options_.localAddr;
  self_.id = options_.localAddr + "-" + std::to_string(::getpid()) + "-" + randomHex(6);
  self_.nproc = options_.nproc;
  self_.fixedRank = options_.fixedRank;

  main_ = connect();
  sharedWatcher_ = options_.watcherOnAgentConnection && main_.cancelWaits != nullptr;
  log_ = std::make_unique<StateLog>(*main_.store, lim, options_.backend->slotJoin());
  checkSettings();
  // The background threads connect on their own threads, off the join's critical path.
  auto liveness = options_.backend->startLiveness(LivenessContext{
      .runId = options_.runId,
      .self = self_.id,
      .limits = lim,
      .view = view_,
      .first = *main_.store,
      .connect = [this] { return connect(); },
      .onError = [this](std::exception_ptr e) { onBackgroundError(e); },
      .spill = options_.backend->slotJoin()});
  {
    // Under mu_: onBackgroundError (a liveness thread may already fail) halts it through this.
    std::lock_guard<std::mutex> g(mu_);
    liveness_ = std::move(liveness);
    if (storeLost_ && liveness_) liveness_->haltWatching();
  }
  watcher_ = Background([this] { watcherLoop(); });
  DDPRUN_LOG(INFO, "rendezvous") << "node " << self_.id << " connected to rendezvous '"
                                 << options_.runId << "' at " << options_.backend->describe();
}

DynamicRendezvous::~DynamicRendezvous() {
  {
    std::lock_guard<std::mutex> g(mu_);  // the watcher publishes its connection under mu_
    stopping_ = true;
    if (watcherConn_.interrupt) watcherConn_.interrupt();
  }
  cv_.notifyAll();
  if (watcher_.joinable()) watcher_.join();
  liveness_.reset();
}

// Every node of a job must agree on its bounds and budget; a mismatch is a configuration
// error, reported before this node takes part.
void DynamicRendezvous::checkSettings() {
  const auto& lim = options_.limits;
  std::string mine = "nnodes=" + std::to_string(lim.minNodes) + ":" +
                     std::to_string(lim.maxNodes) +
                     " max_restarts=" + std::to_string(lim.maxRestarts) +
                     " backend=" + options_.backend->name();
  // Named for arrival ranks (the default) only, so that a job's settings with stable ranks read
  // as they always did, and an older agent (whose default was stable) is refused, not mixed in.
  if (options_.arrivalRanks && options_.backend->slotJoin()) mine += " rank_order=arrival";
  std::string theirs = main_.store->compareSet("settings", "", mine);
  if (theirs != mine) {
    // Only the rank order differs: most likely agents of two ddprun versions (the default became
    // arrival at stop 35), so say how to make them agree.
    const std::string arrival = " rank_order=arrival";
    const auto strip = [&](std::string s) {
      const auto at = s.find(arrival);
      return at == std::string::npos ? s : s.erase(at, arrival.size());
    };
    const std::string hint =
        strip(mine) == strip(theirs)
            ? " (node ranks in arrival order are the default since ddprun's stop 35, kept "
              "ranks before: give every node --rdzv-conf rank_order=arrival, or every node "
              "rank_order=stable)"
            : "";
    throw ConfigError("rendezvous '" + options_.runId + "' at " + options_.backend->describe() +
                      ": this node has " + mine + " but the job's other nodes have " + theirs +
                      ": give every node the same --nnodes, --max-restarts, --rdzv-backend and "
                      "--rdzv-conf rank_order" + hint);
  }
}

bool DynamicRendezvous::storeLost() {
  std::lock_guard<std::mutex> g(mu_);
  return storeLost_;
}

void DynamicRendezvous::interrupt() {
  std::lock_guard<std::mutex> g(mainMu_);
  interrupted_ = true;
  main_.interrupt();
}

// Only the agent's thread replaces main_ (under mainMu_); it reads main_ without the lock.
void DynamicRendezvous::interruptForLeave() {
  leaving_ = true;
  interrupt();
}

void DynamicRendezvous::reconnectIfInterrupted(bool leaving) {
  auto refuse = [&] {
    if (!leaving && leaving_) throw NetworkError("interrupted: this agent is leaving the job");
  };
  refuse();
  if (!interrupted_.exchange(false)) return;
  {
    // Once the liveness signal has declared the store lost, a reconnect would only hold this
    // agent for connect_timeout (60 s by default) per call: fail at once instead.
    std::lock_guard<std::mutex> g(mu_);
    if (storeLost_) {
      interrupted_ = true;  // and so does every later call
      throw NetworkError("the rendezvous store at " + options_.backend->describe() +
                         " is lost: not reconnecting");
    }
  }
  auto fresh = connect();
  auto log = std::make_unique<StateLog>(*fresh.store, options_.limits, options_.backend->slotJoin());
  {
    std::lock_guard<std::mutex> g(mainMu_);
    std::swap(main_, fresh);
    std::swap(log_, log);
  }
  refuse();  // a leave that came in meanwhile
}

Versioned DynamicRendezvous::fresh() {
  Versioned seen = view_.get();
  if (seen.version > current_.version) current_ = seen;
  current_ = log_->refresh(current_);
  view_.offer(current_);
  return current_;
}

void DynamicRendezvous::watch(int64_t round) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (round < 0) {
      disarmLocked(lock);
    } else {
      watchRound_ = round;
      watchFrom_ = current_;
      watchLosses_ = options_.limits.keepRoundOnNodeLoss && round_.nodeRank == 0;
    }
  }
  cv_.notifyAll();
}

void DynamicRendezvous::disarmLocked(std::unique_lock<std::mutex>& lock) {
  watchRound_ = -1;
  if (!sharedWatcher_ || !watcherBusy_) return;
  // Take the shared connection back: the watcher's WAIT (or the read after it) ends at once.
  watcherConn_.cancelWaits(true);
  // A store that stopped answering (SIGSTOP, hung) answers no CANCEL_WAIT either: once it is
  // known lost (the heartbeat writer's keep-alive bound), or after read_timeout, the call is cut
  // instead (the connection is dropped; the agent's next call reconnects) -- never a wait for
  // the watcher's own hour-long slice.
  const auto deadline = Clock::now() + options_.store.timeout;
  cv_.waitUntil(lock, deadline, [&] { return !watcherBusy_ || storeLost_; });
  while (watcherBusy_) {  // again if the cut fell between two of the watcher's calls
    watcherConn_.cancelCall();
    cv_.waitFor(lock, std::chrono::milliseconds(100), [&] { return !watcherBusy_; });
  }
  watcherConn_.cancelWaits(false);
}

bool DynamicRendezvous::pauseWatcher(int64_t r) {
  std::unique_lock<std::mutex> lock(mu_);
  if (watchRound_ != r) return false;
  disarmLocked(lock);
  return true;
}

// Waits on `round/<r>/over` of the round the agent runs in, and tells the agent when it
// fires -- unless the agent has moved on (disarmed) by then. On its own connection, or on the
// agent's (sharedWatcher_), which it holds only while armed: disarming cancels its WAIT.
void DynamicRendezvous::watcherLoop() {
  if (!sharedWatcher_) {
    try {
      auto c = connect();
      std::lock_guard<std::mutex> g(mu_);
      if (stopping_) return;
      watcherConn_ = std::move(c);
    } catch (const Error&) {
      onBackgroundError(std::current_exception());
      return;
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || watchRound_ >= 0; });
    if (stopping_) return;
    const int64_t r = watchRound_;
    const Versioned from = watchFrom_;
    const bool losses = watchLosses_;
    const std::function<void()> disarmedForTest = watcherDisarmedForTest_;
    if (sharedWatcher_) {
      // Armed: the agent is not using its connection, and does not replace it (reconnect)
      // before disarming, which waits for watcherBusy_ to clear.
      std::lock_guard<std::mutex> g(mainMu_);
      watcherConn_ = main_;
      watcherBusy_ = true;
    }
    const InterruptibleStore conn = watcherConn_;
    lock.unlock();
    auto armed = [&] {
      std::lock_guard<std::mutex> g(mu_);
      return !stopping_ && watchRound_ == r;
    };
    Versioned ended;
    bool fired = false;
    std::exception_ptr error;
    try {
      StateLog log(*conn.store, options_.limits);
      std::optional<Versioned> v;
      if (losses) {
        // Disarmed (nullopt): back to the arm below, never on to the `over` marker. The agent
        // may re-arm this same round between watchVersions' last look and this line (its
        // recovery's write woke this thread while it was disarmed): a marker wait would then
        // miss every later member lost in process, which writes no marker (stop 39's flake).
        v = watchVersions(log, r, from, armed);
        if (!v && disarmedForTest) disarmedForTest();
      } else {
        while (!v && armed()) v = log.waitMarkerRead(overKey(r), kWatchSlice);
      }
      if (v) {
        ended = std::move(*v);
        view_.offer(ended);
        fired = true;
      }
    } catch (const Error&) {
      error = std::current_exception();
    }
    lock.lock();
    if (watcherBusy_) {
      watcherBusy_ = false;
      cv_.notifyAll();
    }
    if (stopping_) return;
    // The agent ended the round itself (an error meanwhile is its cancelling the wait).
    if (watchRound_ != r) continue;
    if (error) {
      if (sharedWatcher_ && interrupted_) {
        // interrupt() cut the agent's connection, which it will replace: not a lost store.
        cv_.wait(lock, [&] { return stopping_ || watchRound_ != r; });
        continue;
      }
      lock.unlock();
      onBackgroundError(error);
      return;
    }
    if (!fired) continue;  // paused and resumed (re-armed) meanwhile: from the arm's version
    watchRound_ = -1;
    RoundEvent e;
    e.round = r;
    e.message = ended.state.reason;
    e.exitCode = ended.state.exitCode;
    e.restarts = ended.state.restarts;
    e.kind = ended.state.phase == Phase::Failed     ? RoundEvent::Kind::JobFailed
             : ended.state.phase == Phase::Finished ? RoundEvent::Kind::JobFinished
                                                    : RoundEvent::Kind::Superseded;
    lock.unlock();
    DDPRUN_LOG(INFO, "rendezvous") << "round " << r << " is over: " << e.message;
    emit(e);
    lock.lock();
  }
}

void DynamicRendezvous::onWatcherDisarmedForTest(std::function<void()> fn) {
  std::lock_guard<std::mutex> g(mu_);
  watcherDisarmedForTest_ = std::move(fn);
}

std::optional<Versioned> DynamicRendezvous::watchVersions(StateLog& log, int64_t r, Versioned cur,
                                                          const std::function<bool()>& armed) {
  // Every version, not a marker: a member lost in process leaves the round open, so no marker
  // says so; the versions of a running round are few (recoveries, the exit barrier).
  while (armed()) {
    const RoundState& s = cur.state;
    if (s.round != r || s.phase != Phase::Closed) return cur;  // the round is over
    if (!s.finishing()) {
      for (const auto& id : s.lost) {
        if (!reportedLost_.insert(id).second) continue;
        const auto at = position(log.store(), s, RoundState::List::Members, id);
        if (!at) continue;  // not a member: nothing of it runs
        RoundEvent e;
        e.kind = RoundEvent::Kind::NodeLost;
        e.round = r;
        e.restarts = s.restarts;
        e.message = s.reason;
        e.lostId = id;
        e.lostNodeRank = static_cast<int>(at->index);
        DDPRUN_LOG(WARN, "rendezvous") << "node rank " << e.lostNodeRank << " (" << id
                                       << ") is lost; the round goes on: " << s.reason;
        emit(e);
      }
    }
    if (auto nv = log.waitNewer(cur, kWatchSlice)) cur = std::move(*nv);
  }
  return std::nullopt;
}

void DynamicRendezvous::emit(const RoundEvent& e) {
  if (onEvent_) onEvent_(e);
}

void DynamicRendezvous::onBackgroundError(std::exception_ptr eptr) {
  std::string what;
  bool corrupt = false;  // the store answered, with a corrupt or forged state (state_log.h)
  try {
    std::rethrow_exception(eptr);
  } catch (const StoreError& ex) {
    what = ex.what();
    corrupt = true;
  } catch (const std::exception& ex) {
    what = ex.what();
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stopping_ || storeLost_) return;
    storeLost_ = true;
    // A node that declared the store lost may be the one cut off (its own threads starved, its
    // link down), and the store may still serve the others: it evicts nobody from now on. Not
    // joined (this may be a liveness thread); under mu_, so liveness_ is not being destroyed.
    if (liveness_) liveness_->haltWatching();
  }
  cv_.notifyAll();  // an agent taking its connection back from the watcher stops waiting
  // The agent's thread may be inside a store call that would go on retrying the dead store
  // (the exit barrier's ADD reconnects for up to connect_timeout): cut it short; with
  // storeLost_ set, reconnectIfInterrupted refuses, so no later call waits either.
  interrupt();
  RoundEvent e;
  e.kind = RoundEvent::Kind::StoreLost;
  e.round = roundNo_;
  e.message = corrupt ? "rendezvous '" + options_.runId + "' at " + options_.backend->describe() +
                            ": " + what
                      : "lost the rendezvous store at " + options_.backend->describe() + ": " + what;
  DDPRUN_LOG(ERROR, "rendezvous") << e.message;
  emit(e);
}

}  // namespace ddprun::rendezvous
