// In-process recovery (docs/recovery.md): after a worker's death the others keep running. The
// agent decides the budget, then replaces the dead ranks (hot spares or new processes) or shrinks
// the group, and publishes the generation record. Grow back and the hot spares themselves are
// agent_spares.cpp.
//
// Several deaths, one recovery: the deaths reported while a recovery's budget decision is
// pending (and in the reactor turn after it comes), and those already under way then
// (processDying: a SIGKILL pending, a zombie whose exit its guard has not reported yet), are
// recovered together in ONE generation, for one restart of --max-restarts (torchrun's rule:
// one recovery, one restart). A death after the decision, while that generation still
// re-forms (survivors in its set-up, a replacement that has not healed), is the next recovery:
// the next generation is published (the survivors give up the superseded one within 200 ms,
// rendezvous/superseded_store.h) as long as a survivor still holds the training state; when
// none does, the group restarts and one line says why.
#include "launcher/agent_impl.h"

#include <boost/asio/steady_timer.hpp>

#include "base/process.h"

namespace ddprun::launcher {
namespace {

bool contains(const std::vector<WorkerResult>& dead, pid_t pid) {
  for (const auto& d : dead) {
    if (d.pid == pid) return true;
  }
  return false;
}

// How a dead worker ended; for one taken at a decision before its exit was reported, what
// processDying() saw (a zombie's status, or a pending SIGKILL).
std::string howItEnded(const WorkerResult& w) {
  return w.ended ? w.describe() : w.describe() + " (its exit not reported yet)";
}

// "1" or "1, 2" (in the order of the list).
std::string rankList(const std::vector<WorkerResult>& dead) {
  std::string s;
  for (const auto& d : dead) s += (s.empty() ? "" : ", ") + std::to_string(d.globalRank);
  return s;
}

}  // namespace

bool Agent::Impl::canRecoverInProcess(const std::vector<WorkerResult>& dead) {
  if (options_.recovery == LaunchOptions::Recovery::Restart) return false;
  rendezvous::StoreServer* store = handler_->workerStore();
  const std::string prefix = rendezvous::recovery::attemptPrefix(round_.restartCount) + "/";
  // Said whenever in-process recovery was in effect: asked for, or chosen by auto (the workers
  // run the elastic loop). Under auto with a program without the runtime a restart is simply
  // the job's semantics, and says nothing more.
  auto refuse = [&](const std::string& why) {
    if (const std::string mode = inProcessInEffect(dead); !mode.empty()) {
      DDPRUN_LOG(WARN, "launcher") << mode << ": " << why << "; restarting the group instead";
    }
    return false;
  };
  if (!round_.useAgentStore) {
    return refuse("only workers that use the agent's store recover in process");
  }
  if (round_.nodeCount > 1) {
    // Several nodes (agent_nodes.cpp): this path is taken when no other worker of this node
    // runs, or for several deaths of this node at once.
    return refuse("on several nodes a death is recovered in process only while another worker "
                  "of its node runs, one death of the node at a time");
  }
  if (store == nullptr) return refuse("the agent does not host its workers' store");
  // No survivor first: at world size 1 (or every rank dead) that is the reason, whatever the
  // dead announced (a single rank's runtime announces nothing: inProcessRecoveryWanted).
  bool anySurvivor = false;
  for (const auto& w : group_->results()) {
    anySurvivor = anySurvivor || (!w.ended && !w.spare && !w.sparesTemplate && !contains(dead, w.pid));
  }
  if (!anySurvivor) return refuse("no worker survived to heal a replacement from");
  auto startedIn = [&](const WorkerResult& w) {
    const size_t lr = static_cast<size_t>(w.localRank);
    return lr < startedGeneration_.size() ? startedGeneration_[lr] : 0;
  };
  auto holdsState = [&](const WorkerResult& w) {
    const auto v = store->get(prefix + rendezvous::recovery::announceKey(w.globalRank));
    return v && std::atoi(v->c_str()) >= startedIn(w);
  };
  // Each dead rank's program runs the elastic loop when a process of that rank announced it,
  // this one or an earlier (a replacement or spare that died before it healed: the survivors
  // still hold the state, the next generation gets a new process).
  for (const auto& r : dead) {
    if (!store->get(prefix + rendezvous::recovery::announceKey(r.globalRank))) {
      return refuse("rank " + std::to_string(r.globalRank) + " had not announced in-process "
                    "recovery (its program does not run the runtime's elastic loop, or it died "
                    "before it held the training state)");
    }
  }
  // The survivors: a worker of the group's start must hold the state (its announcement says its
  // program runs the elastic loop); a replacement or spare started for an earlier death may
  // still be healing (it joins the next generation and heals there), but at least one survivor
  // must hold the state to heal the others from.
  int survivors = 0;
  int holders = 0;
  std::string healing;
  for (const auto& w : group_->results()) {
    if (w.ended || w.spare || contains(dead, w.pid)) continue;
    ++survivors;
    if (holdsState(w)) {
      ++holders;
    } else if (startedIn(w) == 0) {
      return refuse("rank " + std::to_string(w.globalRank) + " (pid " + std::to_string(w.pid) +
                    ") does not hold the training state yet");
    } else {
      healing += (healing.empty() ? "" : ", ") + std::string("rank ") +
                 std::to_string(w.globalRank) + " (pid " + std::to_string(w.pid) + ")";
    }
  }
  if (holders == 0) {
    // Not only under --recovery=in-process: under auto the job would have recovered otherwise.
    DDPRUN_LOG(WARN, "launcher") << "in-process recovery of rank(s) " << rankList(dead)
                                 << " is not possible: no surviving worker holds the training "
                                 << "state (" << healing << " started for an earlier death and "
                                 << "had not healed yet); restarting the group from the newest "
                                 << "checkpoint instead";
    return false;
  }
  if (options_.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink &&
      survivors < options_.shrinkMinRanks) {
    // Below the job's minimum the group restarts at full size (or ends: the budget decides).
    DDPRUN_LOG(WARN, "launcher") << "--recovery-policy=shrink: without rank"
                                 << (dead.size() > 1 ? "s " : " ") << rankList(dead)
                                 << " the group would have " << survivors << " rank(s), below "
                                 << "the job's minimum of " << options_.shrinkMinRanks
                                 << "; restarting the group instead";
    return false;
  }
  return true;
}

std::string Agent::Impl::recoveryMode(bool autoChose) const {
  switch (options_.recovery) {
    case LaunchOptions::Recovery::InProcess:
      return "--recovery=in-process";
    case LaunchOptions::Recovery::Auto:
      return autoChose ? "--recovery=auto (in process: the workers run the runtime's elastic loop)"
                       : "";
    case LaunchOptions::Recovery::Restart:
      break;
  }
  return "";
}

std::string Agent::Impl::inProcessInEffect(const std::vector<WorkerResult>& dead) const {
  if (options_.recovery != LaunchOptions::Recovery::Auto) return recoveryMode(false);
  const std::string mode = recoveryMode(true);
  // Evidence that auto had chosen in-process recovery for this group: a recovery or spares
  // already (both need every worker's announcement), or an announcement in the workers' store
  // (hosted here on one node and on node rank 0; other nodes' agents read it through the link,
  // not on this path).
  if (generation_ > 0 || sparesStarted_) return mode;
  rendezvous::StoreServer* store = handler_->workerStore();
  if (store == nullptr || !round_.useAgentStore) return "";
  const std::string prefix = rendezvous::recovery::attemptPrefix(round_.restartCount) + "/";
  auto announced = [&](const WorkerResult& w) {
    return !w.spare && !w.sparesTemplate &&
           store->get(prefix + rendezvous::recovery::announceKey(w.globalRank)).has_value();
  };
  for (const auto& w : dead) {
    if (announced(w)) return mode;
  }
  for (const auto& w : group_->results()) {
    if (announced(w)) return mode;
  }
  return "";
}

// A shrink with a loaded spare waiting for each dead rank would be followed at once by those
// spares growing the group back at the survivors' next commit (tryGrow): two re-forms where a
// replace takes one, and the epoch split over fewer ranks for nothing, where a replace keeps the
// weights bit-identical. So in a whole group (no rank missing from an earlier shrink, none
// joining) the spares take the ranks at once; a spare still loading leaves it to the shrink.
bool Agent::Impl::sparesTakeShrink(const std::vector<WorkerResult>& dead) const {
  int slots = 0;  // the ranks the group had before these deaths
  for (const auto& w : group_->results()) {
    if (!w.spare && (!w.ended || contains(dead, w.pid))) ++slots;
  }
  if (growPid_ > 0 || slots != options_.nprocPerNode) return false;
  if (loadedSpares() < static_cast<int>(dead.size())) return false;
  DDPRUN_LOG(WARN, "launcher") << "--recovery-policy=shrink: a loaded spare is waiting for rank"
                               << (dead.size() > 1 ? "s " : " ") << rankList(dead)
                               << ", so it takes the rank at once (the group does not shrink "
                               << "and grow back)";
  return true;
}

int Agent::Impl::liveWorkers(pid_t except) const {
  int n = 0;
  for (const auto& w : group_->results()) {
    if (!w.ended && !w.spare && w.pid != except) ++n;
  }
  return n;
}

void Agent::Impl::recoverInProcess(const WorkerResult& r) {
  recoveryPending_ = true;
  pendingDeaths_ = {r};
  const std::string what = "rank " + std::to_string(r.globalRank) + " failed (" + r.describe() + ")";
  const ErrorFile ef = readErrorFile(r.errorFile);
  const bool retryable = ef.retryable.value_or(true);
  // The budget first (--max-restarts counts each recovery): NextRound means one was left.
  DDPRUN_LOG(DEBUG, "launcher") << what << ": asking the rendezvous for a restart of the budget "
                                << "to recover in process";
  handler_->asyncReportRecovery(
      r.exitCode(), retryable ? what : what + ": " + ef.message, retryable,
      [this](std::exception_ptr e, JobDecision d) {
        // One more turn of the reactor before acting on it: an exit report whose pipe became
        // readable meanwhile is read first (asio queues ready descriptors before expired
        // timers), and joins this recovery instead of being the next one.
        auto turn = std::make_shared<asio::steady_timer>(io_, asio::steady_timer::clock_type::now());
        turn->async_wait([this, turn, e, d](boost::system::error_code) {
          guarded([&] {
            afterExitReports(e, d, std::chrono::steady_clock::now() + kExitReportWait);
          });
        });
      });
}

bool Agent::Impl::exitUnreported() const {
  for (const auto& w : group_->results()) {
    if (w.ended || w.spare || w.pid <= 0) continue;
    // Gone (its guard reaped it) or a zombie that exited 0: its guard's report is on its way;
    // a death processDying() sees is taken in by onRecoveryDecision without it.
    if (processDead(w.pid) && !processDying(w.pid)) return true;
  }
  return false;
}

void Agent::Impl::afterExitReports(std::exception_ptr e, JobDecision d,
                                   std::chrono::steady_clock::time_point until) {
  // A worker that died with the first and was already reaped by its guard leaves no trace
  // processDying() can read: wait (in 5 ms turns, up to kExitReportWait) for its guard's
  // report, which joins this recovery (pendingDeaths_) instead of being the next one.
  if (state_ == State::Running && group_ && std::chrono::steady_clock::now() < until &&
      exitUnreported()) {
    auto again = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(5));
    again->async_wait([this, again, e, d, until](boost::system::error_code) {
      guarded([&] { afterExitReports(e, d, until); });
    });
    return;
  }
  recoveryPending_ = false;
  std::vector<WorkerResult> dead = std::move(pendingDeaths_);
  pendingDeaths_.clear();
  if (state_ != State::Running) return;
  // Cut short because this node declared the store lost: its StoreLost decision (posted, maybe
  // not yet here) stops the group; the cut call's own error would be a second, wrong cause.
  if (e && handler_->storeLost()) return;
  if (e) std::rethrow_exception(e);
  onRecoveryDecision(std::move(dead), d);
}

void Agent::Impl::noticeDyingWorkers() {
  if (state_ != State::Running || !group_) return;
  std::vector<std::pair<pid_t, int>> dying;  // pid, wait status
  for (const auto& w : group_->results()) {
    if (w.ended || w.spare || w.pid <= 0 || contains(pendingDeaths_, w.pid) ||
        std::find(recoveredEarly_.begin(), recoveredEarly_.end(), w.pid) != recoveredEarly_.end()) {
      continue;
    }
    int status = 0;
    if (processDying(w.pid, &status)) dying.emplace_back(w.pid, status);
  }
  // Each ends in the group now (its `exited` callback, onWorkerExited, as from its guard), so
  // that everything reading the group (survivors, grow back) no longer counts it.
  for (const auto& [pid, status] : dying) {
    if (state_ != State::Running || !group_) return;
    group_->endEarly(pid, status);
  }
}

void Agent::Impl::addPendingDeath(const WorkerResult& r) {
  const WorkerResult& first = pendingDeaths_.front();
  pendingDeaths_.push_back(r);
  DDPRUN_LOG(ERROR, "launcher") << "rank " << r.globalRank << " (local rank " << r.localRank
                                << ", pid " << r.pid << ") failed too: " << r.describe()
                                << "; it is recovered together with rank " << first.globalRank
                                << " (one generation, one restart for both)";
}

void Agent::Impl::onRecoveryDecision(std::vector<WorkerResult> dead, const JobDecision& d) {
  // Deaths under way whose exits the guards have not reported yet (two ranks SIGKILLed at
  // once): taken into this recovery now; their exits are ignored when they come.
  for (const auto& w : group_->results()) {
    if (w.ended || w.spare || w.pid <= 0 || contains(dead, w.pid)) continue;
    int status = 0;
    if (!processDying(w.pid, &status)) continue;
    dead.push_back(w);
    dead.back().waitStatus = status;  // how it ended, for the log and the record
    recoveredEarly_.push_back(w.pid);
  }
  // Several nodes (agent_nodes.cpp): one death of this node at a time; the budget was spent
  // in the rendezvous without ending the round (d.recovered).
  if (acrossNodes() && d.kind == JobDecision::Kind::NextRound && d.recovered &&
      dead.size() == 1 && liveWorkers(dead.front().pid) > 0) {
    if (options_.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink) {
      shrinkAcross(dead.front(), d);
    } else {
      replaceAcross(dead.front(), d);
    }
    return;
  }
  if (!acrossNodes() && d.kind == JobDecision::Kind::NextRound && d.recovered &&
      canRecoverInProcess(dead)) {
    if (options_.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink &&
        !sparesTakeShrink(dead)) {
      shrinkGroup(dead, d);
    } else {
      replaceWorkers(dead, d);
    }
    return;
  }
  // The budget is spent (or the error cannot be retried), or no survivor can heal the others:
  // the group stops as after any failure, the first death its root cause, and the decision
  // taken stands (no second restart counted): a restart, or the end.
  recoveredEarly_.clear();
  const WorkerResult& r = dead.front();
  rootCause_ = r;
  // Several nodes: a budget spent for a recovery left the round open; the restart must end it
  // for every node, so the failure is reported again, spending nothing more
  // (asyncReportFailedRecovery).
  if (d.recovered && round_.nodeCount > 1) {
    recoverySpentRestart_ = true;
  } else {
    decidedFailure_ = d;
  }
  DDPRUN_LOG(ERROR, "launcher") << "rank " << r.globalRank << " (local rank " << r.localRank
                                << ", pid " << r.pid << ") failed: " << r.describe()
                                << "; stopping the other workers";
  stopGroup(StopReason::WorkerFailed, SIGTERM);
}

void Agent::Impl::publishGeneration(const rendezvous::recovery::GenerationRecord& record,
                                    const std::vector<WorkerResult>& dead,
                                    const std::string& what, const JobDecision& d,
                                    bool budgetSpent) {
  // The record: the survivors WAIT for it (a replacement or spare reads it in init()).
  handler_->workerStore()->set(
      rendezvous::recovery::attemptPrefix(round_.restartCount) + "/" +
          rendezvous::recovery::generationKey(record.generation),
      rendezvous::recovery::formatGenerationRecord(record));
  const bool shrink = !record.removed.empty();
  events::Args args;
  args.add("cause", record.cause)
      .add("generation", record.generation)
      .add("rank", dead.front().globalRank)
      .add("ranks", rankList(dead))
      .add("restarts_spent", d.restartCount);
  if (shrink) {
    args.add("policy", "shrink").add("world_size", record.worldSize);
  } else {
    args.add("spare", record.spare);
  }
  events::instant("recovery", "agent", args);
  std::string deaths;
  for (const auto& w : dead) {
    deaths += (deaths.empty() ? "" : "; ") + std::string("rank ") +
              std::to_string(w.globalRank) + " (local rank " + std::to_string(w.localRank) +
              ", pid " + std::to_string(w.pid) + ") failed: " + howItEnded(w);
  }
  const std::string budget =
      budgetSpent ? "restart " + std::to_string(d.restartCount) + " of " +
                        std::to_string(options_.maxRestarts) + " spent" +
                        (dead.size() > 1 ? ", one for the " + std::to_string(dead.size()) +
                                               " deaths"
                                         : std::string())
                  : std::string("no restart spent");
  DDPRUN_LOG(WARN, "launcher") << deaths << "; recovering in process (generation "
                               << record.generation << "): " << what << " (" << budget << ")";
}

std::string Agent::Impl::deathCause(const std::vector<WorkerResult>& dead) const {
  std::string cause;
  for (const auto& w : dead) {
    cause += (cause.empty() ? "" : "; ") + std::string("rank ") + std::to_string(w.globalRank) +
             " (pid " + std::to_string(w.pid) + ") failed: " + howItEnded(w);
  }
  return cause;
}

void Agent::Impl::replaceWorkers(const std::vector<WorkerResult>& dead, const JobDecision& d) {
  const int generation = ++generation_;
  recoveryRestarts_ = d.restartCount;
  const std::string table = progressTablePath();
  std::string takers;
  std::vector<std::pair<int, pid_t>> sparesTaken;  // id, pid
  rendezvous::recovery::GenerationRecord record{.generation = generation,
                                                .cause = deathCause(dead)};
  for (const auto& r : dead) {
    const int lr = r.localRank;
    if (!table.empty()) {
      progressTable_->reset(lr, FreezePolicy::heartbeatPeriodMs(options_.peerTimeout));
    }
    int spareId = -1;
    pid_t sparePid = -1;
    if (!giveRankToSpare(r, generation, spareId, sparePid)) {
      group_->add(makeLaunch(round_, lr, generation));
    }
    startedGeneration_[static_cast<size_t>(lr)] = generation;
    record.replaced.push_back(r.globalRank);
    if (spareId >= 0) {
      if (record.spare < 0) record.spare = spareId;
      sparesTaken.emplace_back(spareId, sparePid);
      events::instant("spare assign", "agent",
                      events::Args()
                          .add("spare", spareId)
                          .add("pid", static_cast<int64_t>(sparePid))
                          .add("rank", r.globalRank)
                          .add("local_rank", lr)
                          .add("generation", generation));
    }
    takers += (takers.empty() ? "" : ", ") +
              (spareId >= 0 ? "spare " + std::to_string(spareId) + " (pid " +
                                  std::to_string(sparePid) + ") takes rank " +
                                  std::to_string(r.globalRank)
                            : "a new rank " + std::to_string(r.globalRank) + " is starting");
  }
  publishGeneration(record, dead, "the other workers keep running, " + takers, d);
  // In the background: the next failure's spares, once every worker announced this generation
  // (startOwedSpares): the template's fork copies the program's page tables on the cores the
  // survivors and the spare re-form on (and a spare it cannot fork is exec'd at once).
  sparesOwed_ += static_cast<int>(sparesTaken.size());
  watchProgress();  // the new processes are watched from their first beat
}

void Agent::Impl::shrinkGroup(const std::vector<WorkerResult>& dead, const JobDecision& d,
                              bool budgetSpent) {
  const int generation = ++generation_;
  recoveryRestarts_ = d.restartCount;
  std::vector<int> removed;
  for (const auto& r : dead) removed.push_back(r.globalRank);
  // The survivors keep their order: a rank q becomes q - |{removed ranks < q}| (recovery_keys.h
  // shrinkRank), in the agent's books as in each survivor's runtime, which reads the same record.
  int after = 0;
  std::vector<std::tuple<pid_t, int, int>> renumbered;  // pid, new rank, slot
  for (const auto& w : group_->results()) {
    if (w.ended || w.spare || contains(dead, w.pid)) continue;
    ++after;
    const int rank = rendezvous::recovery::shrinkRank(w.globalRank, removed);
    if (rank != w.globalRank) renumbered.emplace_back(w.pid, rank, w.localRank);
  }
  const int before = after + static_cast<int>(dead.size());
  for (const auto& [pid, rank, lr] : renumbered) {
    group_->renumber(pid, rank);
    group_->setPrefix(pid, prefixFor(rank, lr));
    if (pid == growPid_) growRank_ = rank;  // a joining replacement keeps joining
  }
  if (growPid_ > 0 && contains(dead, growPid_)) {
    // The joining replacement died with the others: grow back ends for the group.
    growPid_ = -1;
    growBackOff_ = true;
  }
  publishGeneration({.generation = generation,
                     .cause = deathCause(dead),
                     .removed = removed,
                     .worldSize = after},
                    dead,
                    "the group shrinks from " + std::to_string(before) + " to " +
                        std::to_string(after) + " rank(s), the others keep running",
                    d, budgetSpent);
  watchProgress();  // the dead ranks' slots are no longer watched; the others by their new ranks
  // A loaded template is asked for the replacement now, while the survivors re-form: the
  // request is one write and its answer is read on this loop (queueFork), and a pair forked
  // ahead is ready in a few milliseconds, so the grow back can be published as soon as the
  // survivors announced this generation (tryGrow). Otherwise the replacement starts once they
  // have (tryGrow): an exec'd process, or the wait for a template still loading, takes this
  // loop, which serves the store their re-form goes through.
  if (spareTemplate_ && spareTemplate_->ready()) startReplacements();
}

}  // namespace ddprun::launcher
