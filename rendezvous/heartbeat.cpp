#include "rendezvous/heartbeat.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "base/errors.h"
#include "base/log.h"
#include "rendezvous/text_fields.h"

namespace ddprun::rendezvous {

std::string heartbeatCounterKey(const std::string& id) { return "hb/" + id; }
std::string heartbeatKey(const std::string& id, int64_t beat) {
  return "hb/" + id + "/" + std::to_string(beat);
}

std::optional<int64_t> beatCount(std::string_view value) {
  int64_t n = 0;
  if (!text::number(value, n)) return std::nullopt;
  return n;
}

std::string forgedCounter(const std::string& key, std::string_view value, const std::string& why) {
  return "rendezvous key '" + key + "' holds '" + std::string(value.substr(0, 64)) +
         (value.size() > 64 ? "...'" : "'") + ", which is corrupt or forged (" + why + ")";
}

std::string ringSuccessor(const std::vector<std::string>& ids, const std::string& self) {
  if (ids.size() < 2) return {};
  auto it = std::upper_bound(ids.begin(), ids.end(), self);
  if (it == ids.end()) it = ids.begin();
  return *it == self ? std::string() : *it;
}

// ---- HeartbeatWriter ----

HeartbeatWriter::HeartbeatWriter(BoundedConnectFn connect, Store& first, std::string id,
                                 HeartbeatOptions options, ErrorFn onError)
    : connect_(std::move(connect)), id_(std::move(id)), options_(options),
      onError_(std::move(onError)) {
  beat(first);
  lastAnswer_ = Clock::now();
  thread_ = std::thread([this] { run(); });
}

HeartbeatWriter::~HeartbeatWriter() { stop(false); }

void HeartbeatWriter::beat(Store& store) {
  const std::string key = heartbeatCounterKey(id_);
  int64_t n = store.add(key, 1);  // a round trip: proves the store is there
  if (n <= last_) {
    // Only this node adds to its counter: a count at or below its last beat was written by
    // another client (a forged negative count; a restarted store that lost it). Its beat keys
    // would go where no watcher waits (one evicted it after the bound): back above the last beat.
    const std::string next = std::to_string(last_ + 1);
    DDPRUN_LOG(WARN, "rendezvous")
        << forgedCounter(key, std::to_string(n),
                         "below this node's last beat " + std::to_string(last_))
        << ": set to " << next;
    store.compareSet(key, std::to_string(n), next);
    n = last_ + 1;
  }
  last_ = n;
  store.set(heartbeatKey(id_, last_), "");
  if (last_ > 2) store.deleteKey(heartbeatKey(id_, last_ - 2));
}

bool HeartbeatWriter::restoreIfForged(Store& store) {
  const std::string key = heartbeatCounterKey(id_);
  const auto v = store.readAll({key}).at(0);
  if (!v) return false;  // missing: an ADD starts it again
  const auto n = beatCount(*v);
  if (n && *n < std::numeric_limits<int64_t>::max()) return false;  // an ADD takes it
  DDPRUN_LOG(WARN, "rendezvous") << forgedCounter(key, *v, "not a beat count this node can add to")
                                 << ": restored to " << last_;
  store.compareSet(key, *v, std::to_string(last_));
  return true;
}

void HeartbeatWriter::run() {
  std::unique_lock<std::mutex> lock(mu_);
  int failures = 0;
  for (auto waitFrom = Clock::now();
       !cv_.wait_for(lock, options_.interval, [&] { return stopping_; });
       waitFrom = Clock::now()) {
    lock.unlock();
    // A wait that ended late means this agent did not run (SIGSTOP, a frozen VM, starvation):
    // that time is not the store's silence, so the last answer moves forward by it. Otherwise
    // an agent resumed after the keep-alive bound would blame a store that is merely gone, or
    // one that closed the connection while it slept, for "stopping answering".
    const auto late = Clock::now() - waitFrom - options_.interval;
    if (late > Clock::duration::zero()) lastAnswer_ += late;
    // What is left of the keep-alive bound since the store's last answer bounds every call of
    // this beat (a reconnect included); at least one interval: after a pause of this agent
    // the last answer is old through no fault of the store.
    const auto left =
        std::chrono::duration_cast<Millis>(lastAnswer_ + options_.timeout() - Clock::now());
    const bool judge = options_.ownStoreBound.count() <= 0;  // not the host's own store
    const Millis bound = judge ? std::max(left, options_.interval) : options_.ownStoreBound;
    const auto beatStart = Clock::now();
    try {
      if (!conn_.store) {
        // The second beat: the writer's own connection, which connects at this beat's first
        // call, within `bound`; published first, so that stop() can cut the connect short.
        InterruptibleStore c = connect_(bound);
        lock.lock();
        if (stopping_) return;
        conn_ = std::move(c);
        lock.unlock();
      }
      conn_.store->setTimeout(bound);
      // A retry: was the failure a forged counter (the store closed the ADD's connection)?
      // Restored, it answered: not its silence, and not a failure counted towards giving up.
      if (failures > 0 && restoreIfForged(*conn_.store)) {
        lastAnswer_ = Clock::now();
        failures = 0;
      }
      beat(*conn_.store);
      lastAnswer_ = Clock::now();
      failures = 0;
    } catch (const Error& e) {
      const auto silent = Clock::now() - lastAnswer_;
      if (judge && silent >= options_.timeout()) {
        // Unanswered for the keep-alive bound: a node this silent would be evicted; the store
        // has stopped answering (a refused or reset connection fails sooner, below). The line
        // names the call that got no reply and how long this beat waited for it: an ADD cut at
        // its timeout tells a silent store from a connect or handshake that never completed.
        char what[320];
        std::snprintf(what, sizeof what,
                      "it stopped answering: no reply to this node's heartbeat for %.1f s (the "
                      "keep-alive bound is %.1f s: heartbeat %.3g s x missed_heartbeats %d); "
                      "the beat's call that failed, after %.1f s: ",
                      std::chrono::duration<double>(silent).count(),
                      std::chrono::duration<double>(options_.timeout()).count(),
                      std::chrono::duration<double>(options_.interval).count(),
                      options_.missedBeats,
                      std::chrono::duration<double>(Clock::now() - beatStart).count());
        lock.lock();
        const bool report = !stopping_;
        lock.unlock();
        if (report) onError_(std::make_exception_ptr(NetworkError(what + std::string(e.what()))));
        return;
      }
      // One retry (the next call reconnects, bounded as above), then give up.
      if (++failures >= 2) {
        lock.lock();
        const bool report = !stopping_;
        lock.unlock();
        if (report) onError_(std::current_exception());
        return;
      }
      DDPRUN_LOG(WARN, "rendezvous") << "heartbeat failed, retrying: " << e.what();
    }
    lock.lock();
  }
}

void HeartbeatWriter::stop(bool clear) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    if (conn_.interrupt && !clear) conn_.interrupt();  // a beat in progress: cut it short
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (!clear) return;
  try {
    // Stopped before the second beat: the first one's keys are deleted over a connection made
    // now (the writer had none yet). A courtesy of a leaving node: when the store's host has
    // gone first (it got the same signal), a refused reconnect ends it at once.
    if (!conn_.store) conn_ = connect_(options_.timeout());
    conn_.store->giveUpWhenRefused();
    conn_.store->deleteKey(heartbeatCounterKey(id_));
    for (int64_t k = std::max<int64_t>(1, last_ - 2); k <= last_; ++k)
      conn_.store->deleteKey(heartbeatKey(id_, k));
  } catch (const Error& e) {
    DDPRUN_LOG(DEBUG, "rendezvous") << "could not delete heartbeat keys: " << e.what();
  }
}

// ---- HeartbeatMonitor ----

HeartbeatMonitor::HeartbeatMonitor(ConnectFn connect, std::string self, HeartbeatOptions options,
                                   JobLimits limits, StateView& view, ErrorFn onError,
                                   bool spill)
    : connect_(std::move(connect)), self_(std::move(self)), options_(options), limits_(limits),
      spill_(spill), view_(view), onError_(std::move(onError)) {
  view_.onChange([this] { onViewChange(); });
  thread_ = std::thread([this] { run(); });
}

HeartbeatMonitor::~HeartbeatMonitor() { stop(); }

void HeartbeatMonitor::halt() {
  stopping_ = true;
  std::lock_guard<std::mutex> g(connMu_);  // run() checks stopping_ under it once connected
  if (conn_.interrupt) conn_.interrupt();  // for good: no later call (an eviction) goes out
}

void HeartbeatMonitor::stop() {
  if (!stopped_.exchange(true)) {
    halt();
    view_.onChange(nullptr);
  }
  view_.stop();
  if (thread_.joinable()) thread_.join();
}

uint64_t HeartbeatMonitor::cancelCount() {
  std::lock_guard<std::mutex> g(connMu_);
  return cancels_;
}

void HeartbeatMonitor::onViewChange() {
  std::lock_guard<std::mutex> g(connMu_);
  ++cancels_;
  if (conn_.cancelWaits) {
    // Every WAIT from now until run() reads the view again ends at once, the connection kept
    // (CANCEL_WAIT): a join changes the view two or three times per agent, and cutting the
    // connection cost a reconnect (and a handshake on the store) each time.
    conn_.cancelWaits(true);
  } else if (conn_.cancelCall) {
    conn_.cancelCall();
  }
}

uint64_t HeartbeatMonitor::rearm() {
  std::lock_guard<std::mutex> g(connMu_);
  if (conn_.cancelWaits) conn_.cancelWaits(false);
  return cancels_;
}

void HeartbeatMonitor::run() {
  try {
    InterruptibleStore c = connect_();
    {
      std::lock_guard<std::mutex> g(connMu_);
      if (stopping_) return;
      conn_ = std::move(c);
    }
    int failures = 0;  // consecutive store failures that were not cancels
    while (!stopping_) {
      // Before the view is read: a change after this point cancels what follows (counted
      // and cancelled in one critical section of onViewChange()).
      const uint64_t cancels = rearm();
      const Versioned v = view_.get();
      try {
        // A compact state (the slot join) names its lists: the successor is read (O(1)).
        const std::string target = ringTarget(store(), v.state, self_, &view_.lists());
        if (target.empty()) {
          if (!view_.waitNewer(v.version)) return;  // alone: wait for the state to change
          continue;
        }
        if (watch(target, v.version, cancels)) evict(target);
      } catch (const TimeoutError& e) {
        // A read's WAIT_GET ended by a state change (cancelWaits): read the ring again.
        if (stopping_ || cancelCount() == cancels) throw;
        continue;
      } catch (const NetworkError& e) {
        // Cut short by a state change (cancelCall): read the ring again; the connection
        // reconnects on its next call. Otherwise retry once before calling the store lost.
        if (stopping_) throw;
        if (cancelCount() == cancels) {
          if (++failures >= 2) throw;
          DDPRUN_LOG(WARN, "rendezvous") << "heartbeat monitor: " << e.what() << "; retrying";
        }
        continue;
      }
      failures = 0;
    }
  } catch (const Error&) {
    if (!stopping_) onError_(std::current_exception());
  }
}

int64_t HeartbeatMonitor::beatOf(const std::string& target) {
  const std::string key = heartbeatCounterKey(target);
  // One round trip, as the ADD of 0 it replaces; a missing counter (its node left, deleting it)
  // costs one interval's wait, and then reads as 0 too.
  const auto v = store().waitGet(key, options_.interval);
  if (!v) return 0;
  if (const auto n = beatCount(*v)) return *n;
  if (*v != warnedForged_) {
    warnedForged_ = *v;
    DDPRUN_LOG(WARN, "rendezvous") << forgedCounter(key, *v, "not a decimal beat count")
                                   << ": node " << target << " counts as not beating";
  }
  return 0;
}

bool HeartbeatMonitor::watch(const std::string& target, int64_t seenVersion, uint64_t cancels) {
  int64_t beat = beatOf(target);
  // A read cut short by a state change (waitGet's WAIT_GET, cancelWaits) read nothing.
  if (stopping_ || cancelCount() != cancels) return false;
  DDPRUN_LOG(DEBUG, "rendezvous") << "watching node " << target << " from beat " << beat;
  while (!stopping_ && view_.get().version == seenVersion) {
    bool arrived = true;
    try {
      store().wait({heartbeatKey(target, beat + 1)}, options_.timeout());
    } catch (const TimeoutError&) {
      arrived = false;
    }
    // Not a timeout but a state change that ended the WAIT (cancelWaits): read the ring again.
    if (stopping_ || (!arrived && cancelCount() != cancels)) return false;
    if (!arrived) {
      // The beat we waited for may have come and gone (we fell behind): ask the counter.
      const int64_t now = beatOf(target);
      if (stopping_ || cancelCount() != cancels) return false;
      if (now <= beat) return true;
      beat = now;
      continue;
    }
    ++beat;
  }
  return false;
}

void HeartbeatMonitor::evict(const std::string& target) {
  if (stopping_) return;  // halted: this node judges nobody (its connection is cut too)
  const std::string reason = "node " + target + " was evicted: no heartbeat for " +
                             std::to_string(options_.timeout().count()) + " ms";
  StateLog log(store(), limits_, spill_);
  auto r = removeNode(log, view_.get(), target, reason);  // O(1) store work on the slot join
  if (r.wrote) {
    DDPRUN_LOG(WARN, "rendezvous") << reason << " (round " << r.now.state.round << ")";
  }
  view_.offer(r.now);
}

// ---- HeartbeatRing ----

HeartbeatRing::HeartbeatRing(const LivenessContext& ctx, HeartbeatOptions options,
                             BoundedConnectFn writerConnect)
    : writer_(std::make_unique<HeartbeatWriter>(std::move(writerConnect), ctx.first, ctx.self,
                                                options, ctx.onError)),
      monitor_(std::make_unique<HeartbeatMonitor>(ctx.connect, ctx.self, options, ctx.limits,
                                                  ctx.view, ctx.onError, ctx.spill)) {}

}  // namespace ddprun::rendezvous
