// DynamicRendezvous, the round operations: join (nextRound), failure, exit barrier, leave.
// The constructor, the connections and the round watcher are in dynamic_rendezvous.cpp.
#include <algorithm>
#include <map>
#include <sstream>

#include "rendezvous/dynamic_rendezvous.h"
#include "base/errors.h"
#include "base/log.h"
#include "rendezvous/node_address.h"

namespace ddprun::rendezvous {

namespace {

Millis until(Clock::time_point t) {
  return std::chrono::duration_cast<Millis>(t - Clock::now());
}

std::string seconds(Millis m) {
  std::ostringstream os;
  os << m.count() / 1000.0 << " s";
  return os.str();
}

std::string endedKey(const std::string& id) { return "ended/" + id; }

// What a leave may spend on the store: a node leaves on a signal, often one its peers got at
// the same moment, and the store's host may be gone by then; the others evict it anyway.
constexpr Millis kLeaveTimeout{2'000};

}  // namespace

RoundInfo DynamicRendezvous::nextRound() {
  DDPRUN_CHECK(!left_, "nextRound() after leave()");
  watch(-1);  // first: a watcher sharing the connection lets go of it before any reconnect
  reconnectIfInterrupted();
  inRound_ = false;
  self_.masterPort = pickFreePort();
  const Versioned closed = options_.backend->slotJoin() ? joinBySlots() : joinAndWait();
  round_ = roundInfo(closed.state);
  if (closed.version > current_.version) current_ = closed;
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
      throw TimeoutError("rendezvous '" + options_.runId + "' at " + options_.backend->describe() +
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
      if (auto v = log_->waitMarkerRead(overKey(s.round), until(joinDeadline))) cur = *v;
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
  if (s.membersList.ref != 0) {  // a compact state: this node's own entry (findSelf)
    DDPRUN_CHECK(selfAt_, "node " << self_.id << " is not in round " << s.round);
    r.nodeRank = static_cast<int>(selfAt_->index);
    r.nodeCount = static_cast<int>(s.membersList.count);
    r.rankOffset = static_cast<int>(selfAt_->rankOffset);
    r.worldSize = static_cast<int>(s.worldSize);
    r.masterAddr = s.masterAddr;
    r.masterPort = s.masterPort;
    return r;  // r.nodes stays empty: reading it would cost O(N)
  }
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

std::vector<NodeInfo> DynamicRendezvous::roundMembers() {
  if (!round_.nodes.empty()) return round_.nodes;
  RoundState s = current_.state;
  if (s.round != round_.round || s.phase == Phase::Joining) return {};
  if (s.compact()) {
    // A watcher on the agent's connection lets go of it meanwhile, and watches on after.
    const bool paused = sharedWatcher_ && inRound_ && pauseWatcher(round_.round);
    try {
      log_->hydrate(s);
    } catch (...) {
      if (paused) watch(round_.round);
      throw;
    }
    if (paused) watch(round_.round);
  }
  return s.members;
}

DynamicRendezvous::AfterFailure DynamicRendezvous::reportFailure(int exitCode,
                                                                const std::string& what,
                                                                bool retryable) {
  DDPRUN_CHECK(inRound_, "reportFailure() outside a round");
  watch(-1);
  reconnectIfInterrupted();
  inRound_ = false;
  const std::string reason = "workers of node " + self_.id + " failed: " + what;
  return afterFailureWrite(
      failNode(*log_, current_, round_.round, self_.id, exitCode, reason, !retryable));
}

DynamicRendezvous::AfterFailure DynamicRendezvous::reportFailedRecovery(const std::string& what) {
  DDPRUN_CHECK(inRound_, "reportFailedRecovery() outside a round");
  watch(-1);
  reconnectIfInterrupted();
  inRound_ = false;
  const std::string reason = "workers of node " + self_.id + " failed: " + what;
  return afterFailureWrite(failRecoveredNode(*log_, current_, round_.round, self_.id, reason));
}

DynamicRendezvous::AfterFailure DynamicRendezvous::afterFailureWrite(const StateLog::Result& r) {
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

DynamicRendezvous::AfterRecovery DynamicRendezvous::reportRecovery(int exitCode,
                                                                  const std::string& what,
                                                                  bool retryable) {
  DDPRUN_CHECK(inRound_, "reportRecovery() outside a round");
  watch(-1);
  reconnectIfInterrupted();
  const std::string reason = "workers of node " + self_.id + " failed: " + what;
  auto r = recoverNode(*log_, current_, round_.round, self_.id, exitCode, reason, !retryable);
  return afterRecoveryWrite(r, /*stays=*/true);
}

DynamicRendezvous::AfterRecovery DynamicRendezvous::afterRecoveryWrite(const StateLog::Result& r,
                                                                      bool stays) {
  current_ = r.now;
  view_.offer(current_);
  if (r.now.state.phase == Phase::Failed) {
    inRound_ = false;
    jobExitCode_ = r.now.state.exitCode;
    jobFailure_ = r.now.state.reason;
    return AfterRecovery::JobFailed;
  }
  const bool sameRound =
      r.wrote && r.now.state.round == round_.round && r.now.state.phase == Phase::Closed;
  if (!stays || !sameRound) {
    inRound_ = false;
    if (stays) {  // meant to stay in the round, but it ended meanwhile
      DDPRUN_LOG(INFO, "rendezvous") << "round " << round_.round
                                     << " had already ended; no restart spent";
    }
    return AfterRecovery::Restart;
  }
  watch(round_.round);  // still in the round: its end is news again
  return AfterRecovery::Recover;
}

DynamicRendezvous::AfterRecovery DynamicRendezvous::reportNodeLoss(const std::string& what,
                                                                  bool inProcess) {
  DDPRUN_CHECK(inRound_, "reportNodeLoss() outside a round");
  watch(-1);
  reconnectIfInterrupted();
  auto r = inProcess ? recoverNode(*log_, current_, round_.round, self_.id, 1, what, false)
                     : log_->update(current_, [&](const RoundState& s) {
                         return transition::reformWithoutLost(s, round_.round, what);
                       });
  return afterRecoveryWrite(r, /*stays=*/inProcess);
}

DynamicRendezvous::AfterSuccess DynamicRendezvous::finishRound() {
  DDPRUN_CHECK(inRound_, "finishRound() outside a round");
  watch(-1);
  reconnectIfInterrupted();
  inRound_ = false;
  const int64_t r = round_.round;
  if (options_.backend->slotJoin()) return finishBySlots(r);
  current_ = log_->update(current_, [&](const RoundState& s) {
    return transition::nodeDone(s, r, self_.id);
  }).now;
  view_.offer(current_);
  auto v = log_->waitMarker(overKey(r), options_.exitBarrierTimeout);
  if (!v) {
    const RoundState& s = fresh().state;
    throw TimeoutError("rendezvous '" + options_.runId + "': exit barrier of round " +
                       std::to_string(r) + ": only " + std::to_string(s.done.size()) + " of " +
                       std::to_string(round_.nodeCount) + " nodes had finished when " +
                       "exit_barrier_timeout=" + seconds(options_.exitBarrierTimeout) +
                       " ran out");
  }
  current_ = log_->read(*v);
  view_.offer(current_);
  return outcomeAfterBarrier();
}

DynamicRendezvous::AfterSuccess DynamicRendezvous::outcomeAfterBarrier() {
  const RoundState& s = current_.state;
  if (s.phase == Phase::Failed) {
    jobExitCode_ = s.exitCode;
    jobFailure_ = s.reason;
    return AfterSuccess::JobFailed;
  }
  return s.phase == Phase::Finished ? AfterSuccess::Finished : AfterSuccess::Rejoin;
}

void DynamicRendezvous::closeJob() {
  if (closed_) return;
  closed_ = true;
  watch(-1);
  if (liveness_) liveness_->stopWatching();  // nothing may be evicted any more
  bool lost;
  {
    std::lock_guard<std::mutex> g(mu_);
    lost = storeLost_;
  }
  if (lost) {
    // The store is gone (its host, or etcd's quorum): telling anyone would only wait for it.
    if (liveness_) liveness_->stop(false);
    return;
  }
  try {
    reconnectIfInterrupted(/*leaving=*/true);
    const Versioned end = current_.state.ended() ? current_ : fresh();
    if (!end.state.ended()) {
      DDPRUN_LOG(DEBUG, "rendezvous") << "closing before the job has ended (round "
                                      << end.state.round << ")";
    } else {
      auto& store = *main_.store;
      store.set(endedKey(self_.id), "");
      if (options_.isHost) {
        // The store must outlive every node's last read of it (pytorch#118891). A node the
        // final state has lost (evicted, left) is waited for only while its heartbeat shows it
        // alive (judgesSilence): one killed, or gone after declaring the store lost, never
        // reads the end, and must not hold the host for close_timeout (issue 20).
        const auto deadline = Clock::now() + options_.closeTimeout;
        std::vector<std::string> keys, lost;
        RoundState all = end.state;
        if (all.compact()) log_->hydrate(all);  // O(N), on the host only
        const bool judges = judgesSilence();
        for (const auto& id : all.allIds()) {
          if (id == self_.id) continue;
          const bool wasLost = std::find(all.lost.begin(), all.lost.end(), id) != all.lost.end();
          if (judges && wasLost) lost.push_back(id);
          else keys.push_back(endedKey(id));
        }
        std::string missing;
        try {
          if (!keys.empty()) store.wait(keys, options_.closeTimeout);
        } catch (const TimeoutError&) {
          for (const auto& k : keys)
            if (!store.check({k})) missing += " " + k.substr(6);
        }
        if (!lost.empty())
          for (const auto& id : awaitLostNodes(std::move(lost), deadline)) missing += " " + id;
        if (!missing.empty()) {
          DDPRUN_LOG(WARN, "rendezvous") << "close_timeout=" << seconds(options_.closeTimeout)
                                         << " ran out before every node learned that the job "
                                         << "ended; not heard from:" << missing;
        }
      }
    }
  } catch (const Error& e) {
    DDPRUN_LOG(WARN, "rendezvous") << "could not tell the other nodes that the job ended: "
                                   << e.what();
  }
  // The job is over: stop the liveness signal (heartbeat keys die with the store; an etcd
  // lease is revoked).
  if (liveness_) liveness_->stop(false);
}

std::vector<std::string> DynamicRendezvous::awaitLostNodes(std::vector<std::string> lost,
                                                           Clock::time_point deadline) {
  Store& store = *main_.store;
  auto recorded = [&](const std::string& id) { return store.check({endedKey(id)}); };
  for (;;) {
    std::erase_if(lost, recorded);
    if (lost.empty()) return lost;
    const auto gone = silent_->silent(store, lost);
    std::erase_if(lost, [&](const std::string& id) {
      return std::find(gone.begin(), gone.end(), id) != gone.end();
    });
    if (lost.empty()) {
      DDPRUN_LOG(DEBUG, "rendezvous") << gone.size() << " lost node(s) silent for the keep-alive "
                                      << "bound: not waited for";
      return lost;
    }
    const Millis left = until(deadline);
    if (left.count() <= 0) return lost;
    std::vector<std::string> keys;
    for (const auto& id : lost) keys.push_back(endedKey(id));
    try {
      store.wait(keys, std::min(left, silent_->step()));
      return {};
    } catch (const TimeoutError&) {
      // Some are still to record it: which, and are they still beating?
    }
  }
}

void DynamicRendezvous::leave(const std::string& reason) {
  if (left_) return;
  watch(-1);
  const std::string why = "node " + self_.id + " (" + self_.addr + ") left: " + reason;
  bool lost;
  {
    std::lock_guard<std::mutex> g(mu_);
    lost = storeLost_;
  }
  if (lost) {  // nobody to tell: a reconnect would only hold this node for connect_timeout
    left_ = true;
    inRound_ = false;
    if (liveness_) liveness_->stopWatching();
    if (liveness_) liveness_->stop(false);
    DDPRUN_LOG(INFO, "rendezvous") << why << " (the rendezvous store was already lost)";
    return;
  }
  reconnectIfInterrupted(/*leaving=*/true);
  left_ = true;
  inRound_ = false;
  if (liveness_) liveness_->stopWatching();
  // Bounded: a store that goes away meanwhile (its host got the same signal) costs this node at
  // most kLeaveTimeout per call, not connect_timeout, and nothing once its port refuses
  // connections; its heartbeat keys are left then.
  main_.store->setTimeout(std::min(main_.store->timeout(), kLeaveTimeout));
  main_.store->giveUpWhenRefused();
  std::string unwritten;  // why the departure is in no version, for the log line
  try {
    Versioned now = fresh();
    if (now.state.phase == Phase::Closed && now.state.round == waitRound_ &&
        !position(*main_.store, now.state, RoundState::List::Members, self_.id)) {
      // On the waiting list by counters (scalable/waiting_list.h): no version names it, so there
      // is nothing to remove; a round that expects it back evicts it by its missing heartbeats.
      current_ = now;
      unwritten = " (it was waiting for a place in round " + std::to_string(now.state.round) +
                  ", named by no version: nothing written; a round that expects it evicts it "
                  "by its missing heartbeats)";
    } else {
      const auto r = removeNode(*log_, now, self_.id, why);
      current_ = r.now;
      if (!r.wrote) {
        unwritten = r.now.state.ended()
                        ? std::string(" (nothing written: the job had already ended)")
                        : " (nothing written: round " + std::to_string(r.now.state.round) +
                              " does not name it)";
      }
    }
  } catch (...) {
    if (liveness_) liveness_->stop(false);
    throw;
  }
  if (liveness_) liveness_->stop(true);
  DDPRUN_LOG(INFO, "rendezvous") << why << unwritten;
}

}  // namespace ddprun::rendezvous
