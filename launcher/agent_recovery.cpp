// In-process recovery (docs/recovery.md): after a worker's death the others keep running. The
// agent decides the budget, then replaces the dead ranks (hot spares or new processes) or shrinks
// the group, publishes the generation record, and later grows a shrunk group back; and it keeps
// the hot spares.
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

// How a dead worker ended; one taken at a decision before its exit was reported is dying.
std::string howItEnded(const WorkerResult& w) {
  return w.ended ? w.describe() : "killed (its exit not reported yet)";
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
  const bool asked = options_.recovery == LaunchOptions::Recovery::InProcess;
  auto refuse = [&](const std::string& why) {
    if (asked) {
      DDPRUN_LOG(WARN, "launcher") << "--recovery=in-process: " << why
                                   << "; restarting the group instead";
    }
    return false;
  };
  rendezvous::StoreServer* store = handler_->workerStore();
  if (store == nullptr || round_.nodeCount != 1 || !round_.useAgentStore) {
    return refuse("only a single node whose workers use the agent's store recovers in process");
  }
  const std::string prefix = rendezvous::recovery::attemptPrefix(round_.restartCount) + "/";
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
  if (survivors == 0) return refuse("no worker survived to heal a replacement from");
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
  handler_->asyncReportFailure(
      r.exitCode(), retryable ? what : what + ": " + ef.message, retryable,
      [this](std::exception_ptr e, JobDecision d) {
        // One more turn of the reactor before acting on it: an exit report whose pipe became
        // readable meanwhile is read first (asio queues ready descriptors before expired
        // timers), and joins this recovery instead of being the next one.
        auto turn = std::make_shared<asio::steady_timer>(io_, asio::steady_timer::clock_type::now());
        turn->async_wait([this, turn, e, d](boost::system::error_code) {
          guarded([&] {
            recoveryPending_ = false;
            std::vector<WorkerResult> dead = std::move(pendingDeaths_);
            pendingDeaths_.clear();
            if (state_ != State::Running) return;
            if (e) std::rethrow_exception(e);
            onRecoveryDecision(std::move(dead), d);
          });
        });
      });
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
    if (!processDying(w.pid)) continue;
    dead.push_back(w);
    recoveredEarly_.push_back(w.pid);
  }
  if (d.kind == JobDecision::Kind::NextRound && canRecoverInProcess(dead)) {
    if (options_.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink) {
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
  decidedFailure_ = d;
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
      progress::resetProgressRecord(table, lr, FreezePolicy::heartbeatPeriodMs(options_.peerTimeout));
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
  // In the background: the next failure's spares.
  for (size_t i = 0; i < sparesTaken.size(); ++i) startSpare(/*idle=*/idleSpares_ == 1);
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
  // The replacement starts once the survivors have re-formed (tryGrow, on their announcements):
  // starting a process takes this loop, which serves the store their re-form goes through.
}

// ---- Grow back ----
//
// After a shrink, once the survivors have re-formed (each announced the new generation), the
// agent starts a replacement as it starts a hot spare in the background
// (hot_spares.h: loaded, connected, waiting in the store, under SCHED_IDLE so that the
// survivors' steps are not slowed). Nothing waits for it. When its ready key is set and every
// worker has announced the newest generation (no recovery in flight), the agent publishes the
// grow record (rendezvous/grow_record.h) and the spare's assignment in one turn of its loop; each
// worker's runtime sees the record through its watch thread and takes it at its next commit
// (runElastic), so the survivors have nothing to roll back; the replacement heals from the
// lowest rank's memory and the trainers split the rest of the epoch over the larger group.
// A grow is no failure: it spends no restart. The joining replacement's death before it
// healed spends none either (the survivors lose no step, they re-form at a commit): the group
// goes on without it, and grows back no more (one line says so), so a replacement that cannot
// join costs a bounded number of re-forms. After it healed it is a worker like any other.

bool Agent::Impl::growBackUsable(std::string& why) const {
  if (options_.recovery == LaunchOptions::Recovery::Restart) {
    why = "--recovery=restart";
    return false;
  }
  if (handler_->workerStore() == nullptr || round_.nodeCount != 1 || !round_.useAgentStore) {
    why = "only a single node whose workers use the agent's store recovers in process";
    return false;
  }
  return true;
}

bool Agent::Impl::backgroundIdle() {
  if (idleSpares_ < 0) {
    std::string why;
    idleSpares_ = canLeaveIdlePriority(why) ? 1 : 0;
    if (idleSpares_ == 0) {
      DDPRUN_LOG(WARN, "launcher") << "spares and replacements started while training runs "
                                   << "start at normal priority, not SCHED_IDLE: " << why;
    }
  }
  return idleSpares_ == 1;
}

void Agent::Impl::startReplacements() {
  std::string why;
  if (!growBackUsable(why) || growBackOff_) return;
  const int missing = options_.nprocPerNode - liveWorkers() -
                      static_cast<int>(group_->waitingSpares().size());
  for (int i = 0; i < missing; ++i) {
    const bool idle = backgroundIdle();
    DDPRUN_LOG(INFO, "launcher") << "grow back: a replacement starts in the background"
                                 << (idle ? " (SCHED_IDLE)" : "") << "; the group takes it in at "
                                 << "a commit once it is ready, nothing waits for it";
    startSpare(idle);
  }
}

void Agent::Impl::tryGrow() {
  if (state_ != State::Running || !group_ || recoveryPending_ || growBackOff_) return;
  rendezvous::StoreServer* store = handler_->workerStore();
  const std::string prefix = rendezvous::recovery::attemptPrefix(round_.restartCount) + "/";
  auto announced = [&](int rank) {
    const auto v = store->get(prefix + rendezvous::recovery::announceKey(rank));
    return v ? std::atoi(v->c_str()) : -1;
  };
  if (growPid_ > 0) {
    // Joining: done once it announced that it holds the state in its generation (or later).
    if (announced(growRank_) < growGeneration_) return;
    DDPRUN_LOG(INFO, "launcher") << "grow back: rank " << growRank_ << " (pid " << growPid_
                                 << ") healed; the group has " << liveWorkers() << " rank(s)";
    growPid_ = -1;
  }
  if (liveWorkers() >= options_.nprocPerNode) return;
  // Every worker in the newest generation: no recovery is under way.
  for (const auto& w : group_->results()) {
    if (w.ended || w.spare) continue;
    if (announced(w.globalRank) < generation_) return;
  }
  startReplacements();  // the ones the group lacks, if not started yet
  for (const auto& s : group_->waitingSpares()) {
    if (s.pid <= 0) continue;
    if (!store->get(prefix + rendezvous::recovery::spareReadyKey(s.spareId))) continue;
    growGroup(s.pid, s.spareId);
    return;
  }
}

void Agent::Impl::growGroup(pid_t sparePid, int spareId) {
  // The replacement takes the lowest slot without a running worker, and the rank that keeps
  // the ranks in slot order: once every slot is filled again, every rank is its slot's.
  int slot = -1;
  for (int lr = 0; lr < options_.nprocPerNode && slot < 0; ++lr) {
    bool taken = false;
    for (const auto& w : group_->results()) taken = taken || (!w.ended && !w.spare && w.localRank == lr);
    if (!taken) slot = lr;
  }
  DDPRUN_CHECK(slot >= 0, "a group that grows has a free slot");
  int rank = round_.rankOffset;
  for (const auto& w : group_->results()) {
    if (!w.ended && !w.spare && w.localRank < slot) ++rank;
  }
  const int before = liveWorkers();
  const int after = before + 1;
  const int generation = ++generation_;
  std::vector<std::tuple<pid_t, int, int>> renumbered;  // pid, new rank, slot
  for (const auto& w : group_->results()) {
    if (w.ended || w.spare) continue;
    const int now = rendezvous::recovery::growRank(w.globalRank, rank);
    if (now != w.globalRank) renumbered.emplace_back(w.pid, now, w.localRank);
  }
  for (const auto& [pid, now, lr] : renumbered) {
    group_->renumber(pid, now);
    group_->setPrefix(pid, prefixFor(now, lr));
  }
  const std::string table = progressTablePath();
  if (!table.empty()) {
    progress::resetProgressRecord(table, slot, FreezePolicy::heartbeatPeriodMs(options_.peerTimeout));
  }
  DDPRUN_CHECK(group_->assign(sparePid, slot, rank), "a waiting spare takes the rank");
  group_->setPrefix(sparePid, prefixFor(rank, slot));
  if (schedulingPolicy(sparePid) == SCHED_IDLE) {
    std::string error;
    leaveIdlePriority(sparePid, error);
    if (!error.empty()) {
      DDPRUN_LOG(WARN, "launcher") << "grow back: the replacement (pid " << sparePid
                                   << ") takes rank " << rank << " but stays at idle priority: "
                                   << error;
    }
  }
  startedGeneration_[static_cast<size_t>(slot)] = generation;
  growPid_ = sparePid;
  growRank_ = rank;
  growGeneration_ = generation;
  const std::string cause = "grow back: spare " + std::to_string(spareId) + " (pid " +
                            std::to_string(sparePid) + ") takes rank " + std::to_string(rank);
  // The record first: the replacement reads it as soon as it has its assignment.
  const std::string prefix = rendezvous::recovery::attemptPrefix(round_.restartCount) + "/";
  rendezvous::StoreServer* store = handler_->workerStore();
  store->set(prefix + rendezvous::recovery::generationKey(generation),
             rendezvous::recovery::formatGrowRecord({.generation = generation,
                                                 .added = rank,
                                                 .worldSize = after,
                                                 .spare = spareId,
                                                 .cause = cause}));
  store->set(prefix + rendezvous::recovery::spareAssignKey(spareId),
             rendezvous::recovery::formatSpareAssignment(
                 {.generation = generation, .rank = rank, .localRank = slot}));
  events::instant("grow", "agent",
                  events::Args()
                      .add("generation", generation)
                      .add("rank", rank)
                      .add("spare", spareId)
                      .add("pid", static_cast<int64_t>(sparePid))
                      .add("world_size", after));
  DDPRUN_LOG(WARN, "launcher") << "grow back (generation " << generation << "): spare "
                               << spareId << " (pid " << sparePid << ") is ready and takes rank "
                               << rank << " (local rank " << slot << "); the group grows from "
                               << before << " to " << after << " rank(s) at the workers' next "
                               << "commit (no restart spent)";
  watchProgress();
  // A warm spare (--spares) grew the group: the next one starts in the background, as after
  // a spare took a dead rank under replace.
  if (sparesStarted_ && liveWorkers() >= options_.nprocPerNode &&
      static_cast<int>(group_->waitingSpares().size()) < options_.spares) {
    startSpare(/*idle=*/backgroundIdle());
  }
}

void Agent::Impl::abandonGrow(const WorkerResult& r) {
  growPid_ = -1;
  growBackOff_ = true;
  DDPRUN_LOG(ERROR, "launcher") << "grow back: the replacement, rank " << r.globalRank
                                << " (local rank " << r.localRank << ", pid " << r.pid
                                << "), died before it healed: " << r.describe() << "; the group "
                                << "goes on without it and grows back no more (see its log in "
                                << runDir_->path() << ")";
  JobDecision d;
  d.restartCount = recoveryRestarts_;
  shrinkGroup({r}, d, /*budgetSpent=*/false);
}

std::string Agent::Impl::prefixFor(int rank, int lr) const {
  auto templ = env_.find("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
  return link_ ? link_->linePrefix(round_.nodeRank, rank, lr)
               : linePrefix(templ != env_.end() ? &templ->second : nullptr, options_.role, rank,
                            lr, round_.worldSize);
}

bool Agent::Impl::giveRankToSpare(const WorkerResult& r, int generation, int& spareId,
                                  pid_t& sparePid) {
  if (!sparesStarted_) return false;
  const pid_t pid = pickSpare(spareId);
  if (pid <= 0 || !group_->assign(pid, r.localRank, r.globalRank)) return false;
  sparePid = pid;
  group_->setPrefix(pid, prefixFor(r.globalRank, r.localRank));
  // A spare started under SCHED_IDLE runs at normal priority from now on: a worker at idle
  // priority would hold back every collective of the group.
  if (schedulingPolicy(pid) == SCHED_IDLE) {
    std::string error;
    leaveIdlePriority(pid, error);
    if (!error.empty()) {
      DDPRUN_LOG(WARN, "launcher") << "spare " << spareId << " (pid " << pid << ") takes rank "
                                   << r.globalRank << " but stays at idle priority: " << error;
    }
  }
  handler_->workerStore()->set(
      rendezvous::recovery::attemptPrefix(round_.restartCount) + "/" +
          rendezvous::recovery::spareAssignKey(spareId),
      rendezvous::recovery::formatSpareAssignment(
          {.generation = generation, .rank = r.globalRank, .localRank = r.localRank}));
  return true;
}

pid_t Agent::Impl::pickSpare(int& id) {
  rendezvous::StoreServer* store = handler_->workerStore();
  const std::string prefix = rendezvous::recovery::attemptPrefix(round_.restartCount) + "/";
  pid_t best = -1;
  bool bestReady = false;
  for (const auto& s : group_->waitingSpares()) {
    if (s.pid <= 0) continue;  // not exec'd yet
    const bool ready = store->get(prefix + rendezvous::recovery::spareReadyKey(s.spareId)).has_value();
    if (best > 0 && (bestReady || !ready)) continue;
    best = s.pid;
    bestReady = ready;
    id = s.spareId;
  }
  // A spare still loading is taken too: it is further on than a process started now.
  return best;
}

bool Agent::Impl::sparesUsable(std::string& why) const {
  if (options_.recovery == LaunchOptions::Recovery::Restart) {
    why = "they take a dead worker's rank only in an in-process recovery, and this job runs "
          "with --recovery=restart";
    return false;
  }
  if (handler_->workerStore() == nullptr || round_.nodeCount != 1 || !round_.useAgentStore) {
    why = "only a single node whose workers use the agent's store recovers in process";
    return false;
  }
  return true;
}

void Agent::Impl::onStoreSet(const std::string& key) {
  if (state_ != State::Running || !group_) return;
  const std::string prefix = rendezvous::recovery::attemptPrefix(round_.restartCount) + "/";
  const bool announce = key.rfind(prefix + "ddprun/recovery/", 0) == 0;
  if (announce) maybeStartSpares();
  // Shrink: grow back on a spare's ready key or a worker's announcement.
  if (options_.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink &&
      (announce || key.rfind(prefix + "ddprun/spare/", 0) == 0)) {
    tryGrow();
  }
}

void Agent::Impl::maybeStartSpares() {
  if (sparesStarted_ || options_.spares <= 0) return;
  std::string why;
  if (!sparesUsable(why)) return;
  const std::string prefix = rendezvous::recovery::attemptPrefix(round_.restartCount) + "/";
  rendezvous::StoreServer* store = handler_->workerStore();
  for (int lr = 0; lr < options_.nprocPerNode; ++lr) {
    if (!store->get(prefix + rendezvous::recovery::announceKey(round_.rankOffset + lr))) return;
  }
  backgroundIdle();  // decided now, for the spares started later
  // Every worker runs the elastic loop: the spares of this group start now, at normal
  // priority (they are part of the job's start, as its workers are).
  sparesStarted_ = true;
  for (int i = 0; i < options_.spares; ++i) startSpare(/*idle=*/false);
}

void Agent::Impl::startSpare(bool idle) {
  if (!group_ || group_->runningCount() == 0 || state_ != State::Running) return;
  const int id = nextSpareId_++;
  WorkerLaunch l = makeLaunch(round_, 0, 0, id);
  l.spawn.idlePriority = idle;
  group_->add(std::move(l));
  DDPRUN_LOG(INFO, "launcher") << "starting spare " << id
                               << (idle ? " in the background (SCHED_IDLE)" : "")
                               << ": it loads and waits for a rank";
}

void Agent::Impl::onSpareExited(const WorkerResult& r) {
  if (r.stopSignal != 0 || state_ != State::Running || group_->runningCount() == 0) return;
  // Shrink: a waiting replacement is started again only while the group lacks a rank or a
  // spare (--spares).
  const int wanted = options_.nprocPerNode + (sparesStarted_ ? options_.spares : 0);
  if (options_.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink &&
      (growBackOff_ ||
       liveWorkers() + static_cast<int>(group_->waitingSpares().size()) >= wanted)) {
    return;
  }
  // Died while waiting: the training group is not touched and no restart is spent. A spare
  // that dies before it is ready, three times in a row, ends the spares of this group.
  const bool wasReady =
      handler_->workerStore()
          ->get(rendezvous::recovery::attemptPrefix(round_.restartCount) + "/" +
                rendezvous::recovery::spareReadyKey(r.spareId))
          .has_value();
  sparesDiedUnready_ = wasReady ? 0 : sparesDiedUnready_ + 1;
  events::instant("spare exit", "agent",
                  events::Args().add("spare", r.spareId).add("pid", static_cast<int64_t>(r.pid))
                      .add("result", r.describe()));
  if (sparesDiedUnready_ >= 3) {
    DDPRUN_LOG(ERROR, "launcher") << "spare " << r.spareId << " (pid " << r.pid << ") died "
                                  << "before it was ready (" << r.describe() << "), the third "
                                  << "in a row: no more spares for this group (see its log "
                                  << "in " << runDir_->path() << ")";
    return;
  }
  DDPRUN_LOG(WARN, "launcher") << "spare " << r.spareId << " (pid " << r.pid << ") died while "
                               << "waiting (" << r.describe() << "): starting another; the "
                               << "workers are not touched, no restart is spent";
  startSpare(/*idle=*/idleSpares_ == 1);
}

void Agent::Impl::unidleSpares() {
  if (!group_) return;
  for (const auto& s : group_->waitingSpares()) {
    std::string error;
    if (s.pid > 0) leaveIdlePriority(s.pid, error);  // best effort: they are killed next
  }
}

}  // namespace ddprun::launcher
