// The agent's loop (agent.h): signals, rounds from the rendezvous handler, starting and
// watching the workers, their exits and the handler's decisions. In-process recovery is in
// agent_recovery.cpp, the end of a round and of the job in agent_end.cpp; the state they share
// is Agent::Impl (agent_impl.h).
#include "launcher/agent_impl.h"

namespace ddprun::launcher {

int Agent::Impl::run() {
  command_ = buildWorkerCommand(options_, env_);
  handler_ = makeRendezvousHandler(io_, options_);
  runDir_ = std::make_unique<RunDirectory>(options_.logDir, options_.rdzvId);
  bool filesWanted = !options_.localRanksFilter.empty();
  for (int lr = 0; lr < options_.nprocPerNode; ++lr) {
    filesWanted = filesWanted || options_.redirects.forRank(lr) || options_.tee.forRank(lr);
  }
  if (filesWanted) runDir_->keep();
  {
    const auto off = env_.find("DDPRUN_CGROUP");
    cgroup_ = JobCgroup::create(options_.rdzvId, off != env_.end() && off->second == "0");
  }
  openTimeline();
  if (setsOmpNumThreads(env_, options_.nprocPerNode)) {
    DDPRUN_LOG(WARN, "launcher") << "setting OMP_NUM_THREADS=1 for each of the "
                                 << options_.nprocPerNode
                                 << " workers (it is unset); set it yourself to tune";
  }
  handler_->setListener(
      [this](const JobDecision& d) { guarded([&] { onHandlerDecision(d); }); });
  for (int sig : options_.signalsToHandle) signals_.add(sig);
  waitForSignal();
  if (link_) {
    link_->attach(io_, [this](int sig) { guarded([&] { onSignal(sig); }); },
                  handler_->hostedStorePort());
  }
  nextRound();
  io_.run();

  if (group_) group_->killAll();
  if (error_) std::rethrow_exception(error_);
  return exitCode_;
}

void Agent::Impl::waitForSignal() {
  signals_.async_wait([this](boost::system::error_code ec, int sig) {
    if (ec) return;
    guarded([&] { onSignal(sig); });
    if (state_ != State::Done) waitForSignal();
  });
}

void Agent::Impl::onSignal(int sig) {
  switch (state_) {
    case State::Running:
      DDPRUN_LOG(WARN, "launcher") << "received " << signalName(sig)
                                   << ": forwarding it to the workers";
      stopGroup(StopReason::Signal, sig);
      break;
    case State::Stopping:
      if (stopReason_ == StopReason::Signal) {
        DDPRUN_LOG(WARN, "launcher") << "received " << signalName(sig)
                                     << " again: killing the workers now";
        group_->stop(SIGKILL, std::chrono::milliseconds(0));
      } else {
        stopReason_ = StopReason::Signal;
        signal_ = sig;
        group_->stop(sig, options_.shutdownTimeout);
      }
      break;
    case State::Rendezvous:
    case State::Finishing:
      DDPRUN_LOG(WARN, "launcher") << "received " << signalName(sig) << ": leaving the job";
      signal_ = sig;
      leaveAndExit(128 + sig);
      break;
    case State::Leaving:
    case State::Closing:
      finish(128 + sig);  // a second signal does not wait for a clean leave
      break;
    case State::Done:
      break;
  }
}

void Agent::Impl::nextRound() {
  if (endIfStoreLost("not joining another round")) return;
  if (group_) mergeTimeline();  // a trace up to this restart, should the job die in the next
  state_ = State::Rendezvous;
  stopReason_ = StopReason::None;
  rootCause_.reset();
  rendezvousStartUs_ = events::nowUs();
  handler_->asyncNextRound(options_.nprocPerNode, [this](std::exception_ptr e, RoundInfo info) {
    guarded([&] {
      if (state_ != State::Rendezvous) return;  // a signal (or the store's loss) meanwhile
      if (e) {
        try {
          std::rethrow_exception(e);
        } catch (const JobEnded& ended) {
          DDPRUN_LOG(WARN, "launcher") << ended.what();
          endJob(ended.exitCode(), ended.summary());
          return;
        } catch (...) {
          // The join was cut short because this node declared the store lost: that line said
          // why; the call's own error ("the server closed the connection") would mislead.
          if (endIfStoreLost("no round joined")) return;
          throw;
        }
      }
      // A round that closed just before this node declared the store lost (the decision is
      // queued behind this completion, or on its way): its workers must not start.
      if (endIfStoreLost("not starting the workers of round " + std::to_string(info.round))) {
        return;
      }
      events::span("rendezvous", "agent", rendezvousStartUs_,
                   events::nowUs() - rendezvousStartUs_,
                   events::Args()
                       .add("round", info.round)
                       .add("attempt", info.restartCount)
                       .add("node_rank", info.nodeRank)
                       .add("nodes", info.nodeCount)
                       .add("world_size", info.worldSize));
      startWorkers(info);
    });
  });
}

std::string Agent::Impl::progressTablePath() const {
  // The job's progress table (base/progress_file.h), when a watch reads it: opened at the
  // first call (when the first workers start), in memory unless the system refuses it.
  if (options_.stallWarning == 0 && options_.peerTimeout <= 0) return std::string();
  if (!progressTable_) {
    progressTable_ = std::make_unique<progress::ProgressTable>(
        [this] { return runDir_->path() + "/progress"; });
  }
  return progressTable_->path();
}

std::vector<WorkerLaunch> Agent::Impl::makeLaunches(const RoundInfo& round) {
  // The job's progress table, its records reset for this round.
  const std::string progressTable = progressTablePath();
  if (!progressTable.empty()) {
    progressTable_->write(options_.nprocPerNode,
                          FreezePolicy::heartbeatPeriodMs(options_.peerTimeout));
  }
  std::vector<WorkerLaunch> launches;
  for (int lr = 0; lr < options_.nprocPerNode; ++lr) launches.push_back(makeLaunch(round, lr, 0));
  return launches;
}

WorkerLaunch Agent::Impl::makeLaunch(const RoundInfo& round, int lr, int generation,
                                     int spareId) {
  const int nproc = options_.nprocPerNode;
  // A background group must not read a tty; a linked agent's stdin is its link's.
  const bool devNullStdin = link_ != nullptr || ::isatty(STDIN_FILENO) == 1;
  auto templ = env_.find("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
  const std::string progressTable = progressTablePath();
  const int rank = round.rankOffset + lr;
  std::string dir = runDir_->workerDir(round.round, lr);
  if (spareId >= 0) {
    // A spare keeps its error file and logs in a directory of its own, whatever rank it takes.
    dir = runDir_->path() + "/attempt_" + std::to_string(round.round) + "/spare_" +
          (spareId == kSpareTemplateLaunchId ? std::string("template") : std::to_string(spareId));
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
  } else if (generation > 0) {
    // A replacement keeps its own error file and logs next to the dead worker's.
    dir += "/generation_" + std::to_string(generation);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
  }
  WorkerLaunch l;
  l.localRank = lr;
  l.globalRank = rank;
  l.errorFile = dir + "/error.json";
  l.progressFile = progressTable;  // this worker's record: its local rank
  Environment overlay = workerEnvOverlay(WorkerEnvInputs{
      .base = env_, .round = round, .localRank = lr, .localWorldSize = nproc,
      .maxRestarts = options_.maxRestarts, .role = options_.role, .errorFile = l.errorFile,
      .progressFile = l.progressFile});
  // docs/recovery.md: what the runtime's elastic run does after a peer's death, and which
  // generation of the group a replacement joins. In the overlay, so that they replace a value
  // of the same name in ddprun's own environment instead of coming after it.
  overlay["DDPRUN_RECOVERY"] =
      options_.recovery == LaunchOptions::Recovery::Restart     ? "restart"
      : options_.recovery == LaunchOptions::Recovery::InProcess ? "in-process"
                                                                : "auto";
  if (generation > 0) overlay["DDPRUN_GENERATION"] = std::to_string(generation);
  l.spawn = SpawnRequest{.executable = command_.executable,
                         .argv = argvForRank(command_, lr),
                         .env = mergeEnvironment(env_, overlay),
                         .stdinFromDevNull = devNullStdin};
  if (cgroup_) l.spawn.cgroup = cgroup_->workerCgroup();
  // The worker group a rank's collectives belong to (ddprun-trace compares their calls).
  if (!timelineParts_.empty()) {
    l.spawn.env.push_back("DDPRUN_TIMELINE_GROUP=" + round.runId + "/" +
                          std::to_string(round.round));  // = timelineGroup() of the round
  }
  if (spareId >= 0) {
    l.spareId = spareId;
    l.localRank = l.globalRank = -1;
    l.spawn.env = spareEnvironment(l.spawn.env, spareId);
  }

  const std::string prefix =
      spareId >= 0 ? "[spare " + std::to_string(spareId) + "]: "
      : link_      ? link_->linePrefix(round.nodeRank, rank, lr)
                   : linePrefix(templ != env_.end() ? &templ->second : nullptr, options_.role,
                                rank, lr, round.worldSize);
  const bool filteredOut =
      !options_.localRanksFilter.empty() && options_.localRanksFilter.count(lr) == 0;
  auto targets = [&](uint8_t bit, int consoleFd, const char* file, size_t tail) {
    const StreamRoute route = routeStream(bit, options_.redirects.forRank(lr),
                                          options_.tee.forRank(lr), filteredOut);
    return StreamTargets{.consoleFd = route.console ? consoleFd : -1,
                         .prefix = prefix,
                         .filePath = route.file ? dir + "/" + file : "",
                         .tailLines = tail};
  };
  l.stdoutTargets = targets(kStdOut, STDOUT_FILENO, "stdout.log", 0);
  l.stderrTargets = targets(kStdErr, STDERR_FILENO, "stderr.log", WorkerGroup::kTailLines);
  return l;
}

void Agent::Impl::startWorkers(const RoundInfo& round) {
  round_ = round;
  timelineStore_ = handler_->sharedStore(round);
  timelineShipped_ = false;
  auto launches = makeLaunches(round);
  generation_ = 0;
  startedGeneration_.assign(launches.size(), 0);
  recoveryPending_ = false;
  nodeLossPending_ = false;
  pendingDeaths_.clear();
  recoveredEarly_.clear();
  recoveryRestarts_ = round.restartCount;
  decidedFailure_.reset();
  recoverySpentRestart_ = false;
  sparesStarted_ = false;
  growTemplateStarted_ = false;
  sparesDiedUnready_.clear();
  sparesSeenReady_.clear();
  endSpareTemplate();  // the last group's
  sparesOwed_ = 0;
  growPid_ = -1;
  growRank_ = -1;
  growGeneration_ = 0;
  growBackOff_ = false;
  templateWaitSince_.reset();
  templatePollArmed_ = false;
  ++templatePollEpoch_;  // a poll armed for the last group does nothing
  templateWaitOver_ = false;
  ownGenerations_.clear();
  openStoreLink();  // several nodes: in-process recovery through node 0's workers' store
  // In-process recovery on one node: a survivor's hint (recovery_keys.h suspectKey) lets the
  // agent see a death before its exit is reaped.
  bool observe = options_.recovery != LaunchOptions::Recovery::Restart && round.useAgentStore &&
                 round.nodeCount == 1;
  if (options_.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink) {
    std::string why;
    observe = growBackUsable(why) || observe;
  }
  // A single rank has no survivor: in-process recovery heals a dead rank's new process (a
  // spare or not) from a surviving rank's memory, never from disk, and the runtime keeps no
  // in-memory commits at world size 1 (inProcessRecoveryWanted). Said once, at the start.
  const bool singleRank = round.worldSize < 2 && options_.recovery != LaunchOptions::Recovery::Restart;
  if (singleRank && !singleRankNoted_ &&
      (options_.spares > 0 || options_.recovery == LaunchOptions::Recovery::InProcess)) {
    singleRankNoted_ = true;
    DDPRUN_LOG(WARN, "launcher")
        << (options_.spares > 0 ? "--spares=" + std::to_string(options_.spares) + ": no spare starts"
                                : std::string("--recovery=in-process: no in-process recovery"))
        << " while the job has a single rank (world size 1): in-process recovery heals a dead "
        << "rank's new process from a surviving rank's memory, and one rank leaves no survivor; "
        << "its death restarts it from the newest checkpoint (docs/recovery.md)";
  }
  if (options_.spares > 0 && !singleRank) {
    std::string why;
    if (!sparesUsable(why)) {
      if (!sparesNoted_) {
        DDPRUN_LOG(WARN, "launcher") << "--spares=" << options_.spares << ": no spares for this "
                                     << "job: " << why;
      }
      sparesNoted_ = true;
    } else {
      // Spares start once every worker has announced in-process recovery: a program without
      // the runtime (a Python script, a shell worker) never gets one.
      observe = true;
    }
  }
  if (acrossNodes()) {
    // Several nodes: the spares start once this node's workers announced, as the link reads.
    if (observe) startSparesAcross();
  } else if (auto* store = handler_->workerStore(); store && observe) {
    store->setObserver([this](const std::string& key) {
      asio::post(io_, [this, key] { guarded([&] { onStoreSet(key); }); });
    });
  }
  auto group = std::make_shared<WorkerGroup>(
      io_, WorkerGroup::Callbacks{
               .exited = [this](const WorkerResult& r) { guarded([&] { onWorkerExited(r); }); },
               .started = [this](const WorkerResult& r) { guarded([&] { onWorkerStarted(r); }); },
               .stopped = [this] { guarded([&] { onGroupStopped(); }); }});
  // Callbacks only come from the io_context, after start() returns. If start() throws, it
  // has killed and reaped what it started; the error ends the job (fail()).
  std::unique_ptr<SpareTemplate> rankTemplate =
      launches.empty() ? nullptr : templateFromRank(launches.front());
  group->start(std::move(launches));
  group_ = std::move(group);
  if (rankTemplate) {
    rankTemplate->templateSpawned();
    spareTemplate_ = std::move(rankTemplate);
    templateFromRank_ = true;
  }
  state_ = State::Running;
  if (timelineAcrossNodes() && !timelineWriter()) {
    // This machine's offset to node rank 0's (its ranks measure theirs too, from init()).
    std::string host = round.masterAddr;  // "[::1]" -> "::1"
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    rendezvous::TcpStoreOptions workerStore{
        .host = host, .port = round.masterPort,
        .dialect = rendezvous::StoreDialect::Ddprun, .tokenFromEnvironment = false};
    // Rank 0's store (--no-agent-store) takes the job's token, as the rendezvous store does.
    if (!round.useAgentStore) workerStore.authToken = timelineStore_->authToken;
    exchange_->post([workerStore] { timeline::measureClock(workerStore); });
  }
  watchProgress();
  // The attempt is the workers' TORCHELASTIC_RESTART_COUNT (what a trainer prints); a
  // membership change starts a new round of the same attempt.
  DDPRUN_LOG(INFO, "launcher") << "started " << options_.nprocPerNode << " worker(s) of "
                               << round.worldSize << " (attempt " << round.restartCount
                               << ", round " << round.round << ": " << round.restartCount << "/"
                               << options_.maxRestarts << " restarts used; "
                               << handler_->describe() << ")";
}

void Agent::Impl::watchProgress() {
  progressWatch_.reset();
  const std::string table = progressTablePath();
  if (table.empty() || !group_) return;
  std::vector<ProgressWatch::Worker> watched;
  // This node's slots, and those after them of ranks moved here from a lost node.
  int slots = options_.nprocPerNode;
  for (const auto& w : group_->results()) {
    if (!w.spare && !w.sparesTemplate && w.localRank >= slots) slots = w.localRank + 1;
  }
  for (int lr = 0; lr < slots; ++lr) {
    // The rank the slot's process has now (a shrink renumbers); a slot a shrink left empty is
    // not watched.
    int rank = round_.rankOffset + lr;
    bool live = false, any = false;
    for (const auto& w : group_->results()) {
      if (w.spare || w.localRank != lr) continue;
      any = true;
      if (!w.ended) {
        live = true;
        rank = w.globalRank;
      }
    }
    if (any && !live && generation_ > 0 &&
        options_.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink) {
      continue;
    }
    watched.push_back({rank, lr, table});
  }
  progressWatch_ = std::make_unique<ProgressWatch>(
      io_, ProgressWatch::Options{
               .policy = {.thresholdSeconds = std::max(0.0, options_.stallWarning)},
               .warnStalls = options_.stallWarning != 0,
               .freeze = {.timeoutSeconds = options_.peerTimeout},
               .nodeRank = round_.nodeRank,
               .host = agentHostName(),
               .workers = std::move(watched),
               .pidOf = [g = std::weak_ptr<WorkerGroup>(group_)](int localRank) -> long {
                 auto group = g.lock();
                 if (!group) return -1;
                 // The running process of the local rank (a replacement, or a spare that took
                 // the rank, runs after the dead); 0 when every process of it ended.
                 long found = -1;
                 for (const auto& r : group->results()) {
                   if (r.localRank != localRank || r.spare) continue;
                   if (!r.ended) return r.pid;
                   found = 0;
                 }
                 return found;
               },
               .onSilent =
                   [this](const ProgressWatch::Worker& w, long pid, double silent) {
                     guarded([&] { onWorkerSilent(w, pid, silent); });
                   },
               .onFirstSign =
                   [this] {
                     guarded([&] {
                       if (state_ == State::Running && acrossNodes()) storeLink();
                     });
                   }});
}

void Agent::Impl::onWorkerExited(const WorkerResult& r) {
  if (r.sparesTemplate) {
    onSpareTemplateExited(r);
    return;
  }
  if (r.spare) {
    onSpareExited(r);
    return;
  }
  // The last worker: the group closes now and kills its waiting spares; one under SCHED_IDLE
  // would on a busy node wait long for the CPU time its own exit takes, holding the job's end.
  if (group_->runningCount() == 0) unidleSpares();
  events::instant("worker exit", "agent",
                    events::Args()
                        .add("rank", r.globalRank)
                        .add("pid", static_cast<int64_t>(r.pid))
                        .add("failed", r.failed() && r.stopSignal == 0 ? 1 : 0)
                        .add("stopped_by_ddprun", r.stopSignal != 0 ? 1 : 0)
                        .add("result", r.describe()));
  // Stopped below: the group had finished without it (-1, a worker that never started, is none).
  if (growFinishedPid_ > 0 && r.pid == growFinishedPid_) return;
  if (state_ == State::Running && !r.failed() && growPid_ > 0 && r.pid != growPid_ &&
      group_->runningCount() == 1) {
    // Grow back racing the end: every other worker finished its training before the joining
    // replacement healed, so the re-form it waits for will never come. It has nothing to join:
    // stop it (its exit is no failure), and the group closes as after any success.
    DDPRUN_LOG(INFO, "launcher") << "grow back: the other workers finished before the "
                                 << "replacement (pid " << growPid_ << ") joined; stopping it";
    growFinishedPid_ = growPid_;
    growPid_ = -1;
    growBackOff_ = true;
    for (const auto& w : group_->results()) {
      if (w.pid == growFinishedPid_ && !w.ended) {
        group_->kill(w.localRank, "the group finished before it joined");
      }
    }
    return;
  }
  if (state_ != State::Running || !r.failed()) return;
  if (auto it = std::find(recoveredEarly_.begin(), recoveredEarly_.end(), r.pid);
      it != recoveredEarly_.end()) {
    recoveredEarly_.erase(it);  // recovered already, with the death it came with
    return;
  }
  if (recoveryPending_) {
    // A second failure in the window of one recovery's budget decision: recovered with it, in
    // one generation, for one restart (onRecoveryDecision).
    addPendingDeath(r);
    return;
  }
  if (growPid_ > 0 && r.pid == growPid_) {  // (a worker that never started has pid -1)
    abandonGrow(r);
    return;
  }
  // Several nodes: the check reads node 0's store off this thread, so it needs another worker
  // of this node still running: the group of a node whose last worker died has ended (it would
  // be taken for a success), and restarts as before.
  if (acrossNodes() && liveWorkers(r.pid) > 0) {
    checkAcrossNodes(r);  // then recoverInProcess(r) or the group stops
    return;
  }
  if (canRecoverInProcess({r})) {
    recoverInProcess(r);
    return;
  }
  rootCause_ = r;
  DDPRUN_LOG(ERROR, "launcher") << "rank " << r.globalRank << " (local rank " << r.localRank
                                << ", pid " << r.pid << ") failed: " << r.describe()
                                << "; stopping the other workers";
  stopGroup(StopReason::WorkerFailed, SIGTERM);
}

void Agent::Impl::onWorkerStarted(const WorkerResult& r) {
  if (r.sparesTemplate) return;
  if (r.spare) {
    events::instant("spare start", "agent",
                    events::Args()
                        .add("spare", r.spareId)
                        .add("pid", static_cast<int64_t>(r.pid))
                        .add("round", round_.round)
                        .add("attempt", round_.restartCount)
                        .add("idle_priority", schedulingPolicy(r.pid) == SCHED_IDLE ? 1 : 0));
    // A fork of the spare template can set its ready key before this record of its start is
    // read (a few ms): the grow back that key triggered skipped a spare without a pid, and no
    // store write follows to try again.
    std::string why;
    if (options_.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink && growBackUsable(why)) {
      tryGrow();
    }
    return;
  }
  const size_t lr = static_cast<size_t>(r.localRank);
  events::instant("worker start", "agent",
                  events::Args()
                      .add("rank", r.globalRank)
                      .add("local_rank", r.localRank)
                      .add("pid", static_cast<int64_t>(r.pid))
                      .add("round", round_.round)
                      .add("attempt", round_.restartCount)
                      .add("generation", lr < startedGeneration_.size() ? startedGeneration_[lr] : 0));
}

void Agent::Impl::onWorkerSilent(const ProgressWatch::Worker& w, long pid, double silent) {
  if (state_ != State::Running) return;
  char why[160];
  std::snprintf(why, sizeof why, "no heartbeat for %.1f s (--peer-timeout=%g)", silent,
                options_.peerTimeout);
  DDPRUN_LOG(ERROR, "launcher") << "rank " << w.rank << " (local rank " << w.localRank
                                << ", pid " << pid << ") on node " << round_.nodeRank
                                << " stopped answering: " << why
                                << "; it is stopped or frozen, not slow (its heartbeat beats "
                                << "through long steps): killing it (SIGKILL)";
  events::instant("worker frozen", "agent",
                  events::Args().add("rank", w.rank).add("pid", static_cast<int64_t>(pid))
                      .add("silent_s", silent));
  group_->kill(w.localRank, why);  // its exit is a failure: the group restarts as for a death
}

void Agent::Impl::onHandlerDecision(const JobDecision& d) {
  if (d.kind == JobDecision::Kind::NodeLost) {
    onNodeLost(d);  // the round goes on (agent_nodes.cpp)
    return;
  }
  if (state_ != State::Running) {
    // Other states get their decision as a completion -- but for a lost store, which no
    // completion may bring (a round that closed just before): agent_end.cpp.
    if (d.storeLost) onStoreLostNotRunning(d);
    return;
  }
  switch (d.kind) {
    case JobDecision::Kind::NodeLost:
      break;
    case JobDecision::Kind::NextRound:
      events::instant("restart", "agent",
                        events::Args()
                            .add("cause", d.reason)
                            .add("restarts_spent", d.restartCount));
      if (d.restartCount > round_.restartCount) {
        DDPRUN_LOG(WARN, "launcher") << "restarting the workers after a failure on another node "
                                     << "(restart " << d.restartCount << " of "
                                     << options_.maxRestarts << " spent there): " << d.reason;
      } else {
        DDPRUN_LOG(WARN, "launcher") << "restarting the workers (membership changed, no restart "
                                     << "spent): " << d.reason;
      }
      break;
    case JobDecision::Kind::Finished:
      DDPRUN_LOG(WARN, "launcher") << "the job finished while this node was cut off: " << d.reason
                                   << "; stopping what is left of its workers";
      break;
    case JobDecision::Kind::Failed:
      // A lost store has been reported in a line of its own (with its address and why).
      DDPRUN_LOG(ERROR, "launcher") << "stopping the workers: "
                                    << (d.storeLost ? "the rendezvous store is lost" : d.reason);
      break;
  }
  pending_ = d;
  if (workersAlreadyGone()) {
    // They ended on their own while this agent was not looking (it was paused): let their exit
    // records, already waiting in the pipes, arrive instead of signalling them, so that how
    // they ended is known (localSuccess()).
    progressWatch_.reset();
    stopReason_ = StopReason::Decision;
    state_ = State::Stopping;
    return;
  }
  stopGroup(StopReason::Decision, SIGTERM);
}

Agent::Agent(LaunchOptions options, Environment env, AgentLink* link)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(env), link)) {}
Agent::~Agent() = default;
int Agent::run() { return impl_->run(); }
std::string Agent::errorRecord() const { return impl_->errorRecord(); }

}  // namespace ddprun::launcher
