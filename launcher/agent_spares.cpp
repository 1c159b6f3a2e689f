// The processes that join a running group (docs/recovery.md): grow back after a shrink, and
// the hot spares (--spares) that take a dead rank or grow the group back. The recovery that
// publishes the generations they join is agent_recovery.cpp.
#include "launcher/agent_impl.h"

#include <boost/asio/steady_timer.hpp>

#include "base/process.h"

namespace ddprun::launcher {

// ---- Grow back ----
//
// After a shrink the agent starts a replacement as it starts a hot spare (hot_spares.h: loaded,
// connected, waiting in the store): a fork of the spare template, asked at the shrink itself (the
// template forked it ahead of the request), or, without a loaded template, once the survivors have
// re-formed (each announced the new generation), in the background (under SCHED_IDLE so that the
// survivors' steps are not slowed). Nothing waits for it. When its ready key is set and every
// worker has announced the newest generation (no recovery in flight), the agent publishes the grow
// record (rendezvous/grow_record.h) and the spare's assignment in one turn of its loop; each
// worker's runtime sees the record through its watch thread and takes it at its next commit
// (runElastic), so the survivors have nothing to roll back; the replacement heals from the lowest
// rank's memory and the trainers split the rest of the epoch over the larger group. A grow is no
// failure: it spends no restart. The joining replacement's death before it healed spends none
// either (the survivors lose no step, they re-form at a commit): the group goes on without it, and
// grows back no more (one line says so), so a replacement that cannot join costs a bounded number
// of re-forms. After it healed it is a worker like any other.

bool Agent::Impl::growBackUsable(std::string& why) const {
  if (options_.recovery == LaunchOptions::Recovery::Restart) {
    why = "--recovery=restart";
    return false;
  }
  if (handler_->workerStore() == nullptr || round_.nodeCount != 1 || !round_.useAgentStore) {
    why = round_.nodeCount != 1 ? "on several nodes a shrunk group does not grow back yet"
                                : "only a single node whose workers use the agent's store "
                                  "recovers in process";
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
                                   << "start at normal priority, not SCHED_IDLE: ddprun has "
                                   << why << ", so a spare could not leave SCHED_IDLE when it "
                                   << "takes a rank";
    }
  }
  return idleSpares_ == 1;
}

void Agent::Impl::startReplacements() {
  std::string why;
  if (!growBackUsable(why) || growBackOff_) return;
  const int missing = options_.nprocPerNode - liveWorkers() -
                      static_cast<int>(group_->waitingSpares().size()) - sparesForking();
  if (missing > 0 && waitForSpareTemplate()) return;
  for (int i = 0; i < missing; ++i) {
    // A fork of a loaded template is ready in tens of milliseconds, during which the group
    // trains one rank short: at normal priority, the template too (it answers the fork, and
    // the fork's guard inherits its priority). An exec'd one -- no template, or a fork that
    // failed -- loads LibTorch (about a CPU-second): in the background, so that it does not
    // slow the survivors instead.
    const bool forked = spareTemplate_ && spareTemplate_->ready();
    const bool idle = backgroundIdle();
    std::string error;
    if (const pid_t t = runningTemplatePid(); forked && t > 0) leaveIdlePriority(t, error);
    DDPRUN_LOG(INFO, "launcher") << "grow back: a replacement starts"
                                 << (forked ? " (a fork of the spare template)"
                                     : idle ? " in the background (SCHED_IDLE)"
                                            : " in the background")
                                 << "; the group takes it in at "
                                 << "a commit once it is ready, nothing waits for it"
                                 << (error.empty() ? "" : " (the template stays at idle priority: " + error + ")");
    startSpare(idle, forked ? std::optional<bool>(false) : std::nullopt);
  }
}

bool Agent::Impl::waitForSpareTemplate() {
  if (templateWaitOver_ || !spareTemplate_ || spareTemplate_->gone() || spareTemplate_->ready()) {
    return false;
  }
  const auto now = std::chrono::steady_clock::now();
  // At every poll: its pid may not have been known at the first.
  std::string error;
  if (const pid_t t = runningTemplatePid(); t > 0) leaveIdlePriority(t, error);
  if (!templateWaitSince_) {
    templateWaitSince_ = now;
    DDPRUN_LOG(INFO, "launcher") << "grow back: the spare template is still loading; the "
                                 << "replacement is forked from it once it is loaded (waiting up "
                                 << "to " << kTemplateLoadWait.count() << " s; it runs at normal "
                                 << "priority from now on"
                                 << (error.empty() ? "" : ", or would: " + error) << ")";
  }
  if (now - *templateWaitSince_ >= kTemplateLoadWait) {
    templateWaitOver_ = true;
    // Back in the background: the exec'd replacement is the load the group waits for now.
    if (const pid_t t = runningTemplatePid(); t > 0 && idleSpares_ == 1) {
      enterIdlePriority(t, error);
    }
    DDPRUN_LOG(WARN, "launcher") << "grow back: the spare template did not load within "
                                 << kTemplateLoadWait.count() << " s; the replacement is started "
                                 << "as a process (the template goes on loading in the "
                                 << "background)";
    return false;
  }
  if (!templatePollArmed_) {
    templatePollArmed_ = true;
    auto poll = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(5));
    poll->async_wait([this, poll, epoch = templatePollEpoch_](boost::system::error_code) {
      guarded([&] {
        if (epoch != templatePollEpoch_) return;
        templatePollArmed_ = false;
        tryGrow();
      });
    });
  }
  return true;
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
    progressTable_->reset(slot, FreezePolicy::heartbeatPeriodMs(options_.peerTimeout));
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
      static_cast<int>(group_->waitingSpares().size()) + sparesForking() + sparesOwed_ <
          options_.spares) {
    backgroundIdle();
    ++sparesOwed_;  // started once the group has grown (startOwedSpares)
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
  // A ready spare first (it takes the rank at once; one still loading holds the whole group in
  // the recovery until it is), else the one started first, the likeliest to be ready soon.
  // Readiness is its ready key: read in the workers' store where this agent hosts it (one node,
  // or node rank 0 of several), else what the link read (sparesSeenReady_, replaceAcross).
  pid_t best = -1;
  bool bestReady = false;
  for (const auto& s : group_->waitingSpares()) {
    // Not exec'd yet, or dying: a spare whose guard has reaped it (or that a SIGKILL is pending
    // for) while its exit report is still on its way would take the rank and fail the recovery.
    if (s.pid <= 0 || processExiting(s.pid)) continue;
    const bool ready = spareReady(s.spareId);
    if (best > 0 && (bestReady || !ready)) continue;
    best = s.pid;
    bestReady = ready;
    id = s.spareId;
  }
  // A spare still loading is taken too: it is further on than a process started now.
  return best;
}

std::vector<int> Agent::Impl::spareReadyKeysToRead() const {
  std::vector<int> ids;
  if (!sparesStarted_ || handler_->workerStore() != nullptr) return ids;
  for (const auto& s : group_->waitingSpares()) {
    if (s.pid <= 0) continue;  // pickSpare does not take it
    if (sparesSeenReady_.count(s.spareId) > 0) return {};  // a ready one to take: no read
    ids.push_back(s.spareId);
  }
  if (ids.size() < 2) ids.clear();  // one or none: nothing to choose
  return ids;
}

bool Agent::Impl::spareToPick() const {
  if (!sparesStarted_) return false;
  for (const auto& s : group_->waitingSpares())
    if (s.pid > 0 && !processExiting(s.pid)) return true;  // as pickSpare takes them
  return false;
}

bool Agent::Impl::spareReady(int spareId) const {
  // Its ready key: read in the workers' store where this agent hosts it (one node, or node rank
  // 0 of several), else what the link read (sparesSeenReady_, replaceAcross).
  if (rendezvous::StoreServer* store = handler_->workerStore()) {
    return store
        ->get(rendezvous::recovery::attemptPrefix(round_.restartCount) + "/" +
              rendezvous::recovery::spareReadyKey(spareId))
        .has_value();
  }
  return sparesSeenReady_.count(spareId) > 0;
}

int Agent::Impl::loadedSpares() const {
  if (!sparesStarted_) return 0;
  int n = 0;
  for (const auto& s : group_->waitingSpares()) {
    if (s.pid > 0 && !processExiting(s.pid) && spareReady(s.spareId)) ++n;  // as pickSpare
  }
  return n;
}

bool Agent::Impl::sparesUsable(std::string& why) const {
  if (options_.recovery == LaunchOptions::Recovery::Restart) {
    why = "they take a dead worker's rank only in an in-process recovery, and this job runs "
          "with --recovery=restart";
    return false;
  }
  if (round_.worldSize < 2) {
    why = "a single rank (world size 1) leaves no survivor to heal a spare from";
    return false;
  }
  if (!round_.useAgentStore || (round_.nodeCount == 1 ? handler_->workerStore() == nullptr
                                                      : !linkWanted_)) {
    why = "only workers that use the agent's store recover in process";
    return false;
  }
  if (round_.nodeCount > 1 && options_.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink) {
    why = "on several nodes a shrunk group does not grow back yet (docs/recovery.md#several-nodes)";
    return false;
  }
  return true;
}

void Agent::Impl::onStoreSet(const std::string& key) {
  if (state_ != State::Running || !group_) return;
  const std::string prefix = rendezvous::recovery::attemptPrefix(round_.restartCount) + "/";
  if (key.rfind(prefix + "ddprun/suspect/", 0) == 0) {
    noticeDyingWorkers();
    return;
  }
  const bool announce = key.rfind(prefix + "ddprun/recovery/", 0) == 0;
  if (announce) maybeStartSpares();
  if (announce) startOwedSpares();
  // Shrink: grow back on a spare's ready key or a worker's announcement.
  if (options_.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink &&
      (announce || key.rfind(prefix + "ddprun/spare/", 0) == 0)) {
    tryGrow();
  }
}

void Agent::Impl::maybeStartSpares() {
  // Shrink without spares: the template alone, so that the replacement growing the group back
  // after a death is a fork of it (milliseconds) rather than a new process loading LibTorch
  // again (about a CPU-second, while the group trains one rank short).
  const bool templateAlone = options_.spares <= 0 &&
                             options_.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink;
  if (sparesStarted_ || growTemplateStarted_ || (options_.spares <= 0 && !templateAlone)) return;
  std::string why;
  if (!sparesUsable(why) || (templateAlone && !growBackUsable(why))) return;
  const std::string prefix = rendezvous::recovery::attemptPrefix(round_.restartCount) + "/";
  rendezvous::StoreServer* store = handler_->workerStore();
  for (int lr = 0; lr < options_.nprocPerNode; ++lr) {
    if (!store->get(prefix + rendezvous::recovery::announceKey(round_.rankOffset + lr))) return;
  }
  backgroundIdle();  // decided now, for the spares started later
  if (templateAlone) {
    growTemplateStarted_ = true;
    if (templateFromRank_ && spareTemplate_) {
      spareTemplate_->ready();  // reads what it said: Loading, Ready, or nothing (it refused)
      if (!spareTemplate_->gone()) {
        DDPRUN_LOG(INFO, "launcher") << "the spare template is forked from rank "
                                     << round_.rankOffset << " at its init() (pid "
                                     << spareTemplate_->pid() << (idleSpares_ == 1 ? ", under SCHED_IDLE" : "")
                                     << "): the replacements that grow a shrunk group back are "
                                     << "forks of it";
        return;
      }
      DDPRUN_LOG(INFO, "launcher") << "rank " << round_.rankOffset << " forked no spare "
                                   << "template (its log says why): it is started as a process";
      endSpareTemplate();
    }
    // In the background: nothing waits for it, and a death before it is loaded only means an
    // exec'd replacement, as without it.
    startSpareTemplate(/*idle=*/idleSpares_ == 1);
    return;
  }
  // Every worker runs the elastic loop: the spares of this group start now, at normal
  // priority (they are part of the job's start, as its workers are).
  sparesStarted_ = true;
  startSpareTemplate(/*idle=*/false);  // first: the spares started once it is loaded are forks of it
  for (int i = 0; i < options_.spares; ++i) startSpare(/*idle=*/false);
}

void Agent::Impl::startSpare(bool idle, std::optional<bool> idleIfForked) {
  if (!groupRunning()) return;
  // Several nodes: ids unique in the job, as their keys in node 0's store are.
  const int id = round_.nodeCount > 1 ? nextSpareId_++ * round_.nodeCount + round_.nodeRank
                                      : nextSpareId_++;
  WorkerLaunch l = makeLaunch(round_, 0, 0, id);
  l.spawn.idlePriority = idle;
  const bool forkIdle = idleIfForked.value_or(idle);
  if (spareTemplate_ && spareTemplate_->ready()) {
    queueFork(std::move(l), id, forkIdle);  // added to the group once the template answers
    DDPRUN_LOG(INFO, "launcher") << "starting spare " << id
                                 << (forkIdle ? " in the background (SCHED_IDLE)" : "")
                                 << ": it loads and waits for a rank";
    return;
  }
  l.spawner = spareSpawner(id, idleIfForked);
  group_->add(std::move(l));
  DDPRUN_LOG(INFO, "launcher") << "starting spare " << id
                               << (idle ? " in the background (SCHED_IDLE)" : "")
                               << ": it loads and waits for a rank";
  publishSpares();
}

void Agent::Impl::publishSpares() {
  if (round_.nodeCount < 2 || options_.spares <= 0 || !group_ || !acrossNodes()) return;
  std::string ids;
  for (const auto& s : group_->waitingSpares()) {
    ids += (ids.empty() ? "" : ",") + std::to_string(s.spareId);
  }
  // In the link's order: the newest list is the last written.
  storeLink().run(
      [key = rendezvous::recovery::nodeSparesKey(round_.nodeRank), ids](rendezvous::Store& s) {
        s.set(key, ids);
      },
      [](const std::string&) {});  // a broken link fails the recovery that needs it
}

void Agent::Impl::onSpareExited(const WorkerResult& r) {
  if (r.stopSignal != 0 || !groupRunning()) return;
  publishSpares();  // node rank 0 must not name it for a lost node's rank
  // Shrink: a waiting replacement is started again only while the group lacks a rank or a
  // spare (--spares).
  const int wanted = options_.nprocPerNode + (sparesStarted_ ? options_.spares : 0);
  if (options_.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink &&
      (growBackOff_ ||
       liveWorkers() + static_cast<int>(group_->waitingSpares().size()) + sparesForking() >=
           wanted)) {
    return;
  }
  events::instant("spare exit", "agent",
                  events::Args().add("spare", r.spareId).add("pid", static_cast<int64_t>(r.pid))
                      .add("result", r.describe()));
  // Died while waiting: the training group is not touched and no restart is spent. Whether it
  // had been ready is its ready key (its runtime sets it before it waits, and it stays set):
  // read in the workers' store where this agent hosts it (one node, or node rank 0 of several),
  // else over the link to node rank 0's (one round trip before the next spare starts).
  const std::string key = rendezvous::recovery::spareReadyKey(r.spareId);
  if (rendezvous::StoreServer* store = handler_->workerStore()) {
    const std::string prefix = rendezvous::recovery::attemptPrefix(round_.restartCount) + "/";
    replaceDeadSpare(r, store->get(prefix + key).has_value() ? SpareWas::Ready
                                                             : SpareWas::NotReady, "");
    return;
  }
  if (!acrossNodes()) {  // (spares run only with one of the two stores: sparesUsable)
    replaceDeadSpare(r, SpareWas::NotReady, "");
    return;
  }
  auto ready = std::make_shared<bool>(false);
  const int epoch = linkEpoch_;
  storeLink().run([key, ready](rendezvous::Store& s) { *ready = s.check({key}); },
                  [this, r, ready, epoch](const std::string& error) {
                    guarded([&] {
                      if (epoch != linkEpoch_ || !groupRunning()) return;
                      replaceDeadSpare(r, !error.empty() ? SpareWas::Unknown
                                          : *ready       ? SpareWas::Ready
                                                         : SpareWas::NotReady,
                                       error);
                    });
                  });
}

void Agent::Impl::replaceDeadSpare(const WorkerResult& r, SpareWas was, const std::string& error) {
  const std::string self =
      "spare " + std::to_string(r.spareId) + " (pid " + std::to_string(r.pid) + ")";
  if (was == SpareWas::Ready) {
    // Loaded and waiting when it died (killed by an operator, the OOM killer, ...): no
    // start-up failure, so it does not count toward the three in a row.
    sparesDiedUnready_.clear();
    DDPRUN_LOG(WARN, "launcher") << self << " died while waiting, after it was ready ("
                                 << r.describe() << "): starting another; the workers are not "
                                 << "touched, no restart is spent";
    startSpare(/*idle=*/idleSpares_ == 1);
    return;
  }
  // Dead before it was ready (or not known: counted as not ready, as a spare that cannot start
  // would be). Three in a row end the spares of this group: each start costs a node's CPU time.
  const std::string unknown =
      was == SpareWas::Unknown ? "; whether it was ready is not known (its ready key could not "
                                 "be read: " + error + "), counted as not ready"
                               : "";
  sparesDiedUnready_.push_back(self + ": " + r.describe());
  if (sparesDiedUnready_.size() >= 3) {
    std::string all;
    for (const auto& d : sparesDiedUnready_) all += (all.empty() ? "" : "; ") + d;
    DDPRUN_LOG(ERROR, "launcher") << self << " died before it was ready (" << r.describe()
                                  << unknown << "), the third in a row: no more spares for this "
                                  << "group (the three: " << all << "; see their logs in "
                                  << runDir_->path() << ")";
    return;
  }
  DDPRUN_LOG(WARN, "launcher") << self << " died before it was ready (" << r.describe()
                               << unknown << "), " << sparesDiedUnready_.size() << " in a row "
                               << "(the third ends this group's spares): starting another; the "
                               << "workers are not touched, no restart is spent";
  startSpare(/*idle=*/idleSpares_ == 1);
}

void Agent::Impl::unidleSpares() {
  if (!group_) return;
  for (const auto& s : group_->waitingSpares()) {
    std::string error;
    if (s.pid > 0) leaveIdlePriority(s.pid, error);  // best effort: they are killed next
  }
  // The template too: it holds as much memory.
  if (const pid_t t = runningTemplatePid(); t > 0) {
    std::string error;
    leaveIdlePriority(t, error);
  }
}

}  // namespace ddprun::launcher
