// The end of a round and of the job: stopping the group, the exit barrier, the job's end, the
// timeline's exchange and merge, leaving on a signal.
#include "launcher/agent_impl.h"

namespace ddprun::launcher {

namespace {
// Leaving on a signal: the timeline's exchange gets this much per store call, and the writer
// waits this long for the bundles of the nodes that were signalled too.
constexpr std::chrono::milliseconds kSignalExchangeCall{2'000};
constexpr std::chrono::milliseconds kSignalCollectWait{3'000};
}  // namespace

bool Agent::Impl::workersAlreadyGone() const {
  const auto pids = group_->workerPids();
  if (pids.empty()) return false;
  for (pid_t pid : pids) {
    if (::kill(pid, 0) == 0 || errno != ESRCH) return false;  // the guard reaps at once
  }
  return true;
}

void Agent::Impl::stopGroup(StopReason reason, int sig) {
  progressWatch_.reset();
  unidleSpares();  // they are stopped with the group: their exit must not wait for idle CPU
  stopReason_ = reason;
  if (reason == StopReason::Signal) signal_ = sig;
  state_ = State::Stopping;
  group_->stop(sig, options_.shutdownTimeout);
}

void Agent::Impl::onGroupStopped() {
  // What a guard killed from outside could not sweep dies before anything else starts.
  if (cgroup_) cgroup_->sweep();
  endSpareTemplate();  // one forked from a rank is in no guard's tree
  if (state_ == State::Running) {
    // Every worker exited and none failed: the job is done once the other nodes agree.
    progressWatch_.reset();
    state_ = State::Finishing;
    if (timelineAcrossNodes() && !timelineWriter()) {
      // Before the barrier: once the writer has passed it, this node's events are in the store.
      timelineShipped_ = true;
      onExchange(shipTimeline(), [this] { exitBarrier(); });
      return;
    }
    exitBarrier();
    return;
  }
  if (state_ != State::Stopping) return;
  stoppedNotRunning();
}

void Agent::Impl::exitBarrier() {
  if (state_ != State::Finishing) return;  // a signal arrived meanwhile
  handler_->asyncFinish([this](std::exception_ptr e, JobDecision d) {
    guarded([&] {
      if (state_ != State::Finishing) return;
      if (e) {
        try {
          std::rethrow_exception(e);
        } catch (const Error& ex) {
          // As torchrun: a node whose workers all succeeded exits 0 even when the exit barrier
          // cannot complete (the store host is gone, the others did not finish in time).
          DDPRUN_LOG(WARN, "launcher") << "every worker of this node succeeded, but the exit "
                                       << "barrier did not complete: " << ex.what()
                                       << "; exiting 0";
          finish(0);
          return;
        }
      }
      apply(d);
    });
  });
}

bool Agent::Impl::endIfStoreLost(const std::string& what) {
  if (!handler_->storeLost()) return false;
  DDPRUN_LOG(ERROR, "launcher") << "the rendezvous store is lost: " << what << "; exiting 1";
  errorRecord_ = generatedErrorRecord("the rendezvous store is lost (" + what + ")", 1);
  endJob(1, std::string());
  return true;
}

void Agent::Impl::onStoreLostNotRunning(const JobDecision& d) {
  switch (state_) {
    case State::Rendezvous:
      // A join in progress (the protocol cut its call short) or a round's completion queued:
      // neither starts workers; the job ends here (the completion finds the state moved on).
      endIfStoreLost("leaving the round being joined, no workers start");
      break;
    case State::Stopping:
      // A restart decided before the loss cannot join a round through a lost store: once the
      // group has stopped, the job ends here (stoppedNotRunning; exit 0 when every local worker
      // had succeeded). A local failure's report checks the loss itself; a signal's leave and
      // an error's end stand, as does a job that ended.
      if (stopReason_ == StopReason::Decision && pending_.kind == JobDecision::Kind::NextRound) {
        pending_ = d;
      }
      break;
    case State::Running:  // onHandlerDecision
    case State::Finishing:  // the exit barrier's call is cut short: exit 0, its workers succeeded
    case State::Leaving:
    case State::Closing:
    case State::Done:
      break;
  }
}

void Agent::Impl::stoppedNotRunning() {
  switch (stopReason_) {
    case StopReason::WorkerFailed: {
      // The group's results now carry the complete stderr tails.
      for (const auto& r : group_->results()) {
        if (r.localRank == rootCause_->localRank && r.pid == rootCause_->pid) rootCause_ = r;
      }
      if (decidedFailure_) {
        // In-process recovery asked the budget already: that decision stands.
        afterLocalFailure(*decidedFailure_);
        break;
      }
      std::string what = "rank " + std::to_string(rootCause_->globalRank) + " failed (" +
                         rootCause_->describe() + ")";
      // The worker's error file may say that a restart cannot help (a bad setting, an
      // incompatible checkpoint): then the job ends now, with that message.
      const ErrorFile ef = readErrorFile(rootCause_->errorFile);
      const bool retryable = ef.retryable.value_or(true);
      if (!retryable) {
        what += ": " + ef.message;
        DDPRUN_LOG(ERROR, "launcher") << "rank " << rootCause_->globalRank << " failed with an "
                                      << "error a restart cannot fix: " << ef.message;
      }
      // Once the store is lost no budget can be asked (its line said why): the failure is
      // reported here and the job ends for this node with exit 1.
      const JobDecision lost{.kind = JobDecision::Kind::Failed, .exitCode = 1,
                             .reason = "the rendezvous store is lost", .storeLost = true};
      if (handler_->storeLost()) {
        afterLocalFailure(lost);
        break;
      }
      auto decided = [this, lost](std::exception_ptr e, JobDecision d) {
        guarded([&] {
          if (state_ != State::Stopping) return;
          if (e && handler_->storeLost()) {
            afterLocalFailure(lost);  // the report was cut short by the loss
            return;
          }
          if (e) std::rethrow_exception(e);
          afterLocalFailure(d);
        });
      };
      if (recoverySpentRestart_) {
        handler_->asyncReportFailedRecovery(rootCause_->exitCode(), what, std::move(decided));
      } else {
        handler_->asyncReportFailure(rootCause_->exitCode(), what, retryable, std::move(decided));
      }
      break;
    }
    case StopReason::Decision:
      if (pending_.storeLost && localSuccess()) {
        // The store went away after every local worker had succeeded: its host exits once the
        // job has ended, so this node's part is done (torchrun exits 0 here too).
        DDPRUN_LOG(WARN, "launcher") << pending_.reason << "; every worker of this node had "
                                     << "succeeded: exiting 0";
        finish(0);
        break;
      }
      apply(pending_);
      break;
    case StopReason::Signal:
      leaveAndExit(128 + signal_, /*groupStopped=*/true);
      break;
    case StopReason::Error:
    case StopReason::None:
      finish(1);
      break;
  }
}

void Agent::Impl::afterLocalFailure(const JobDecision& d) {
  const WorkerResult& rc = *rootCause_;
  if (d.kind == JobDecision::Kind::NextRound) {
    events::instant("restart", "agent",
                      events::Args()
                          .add("cause", "rank " + std::to_string(rc.globalRank) + " failed (" +
                                            rc.describe() + ")")
                          .add("restarts_spent", d.restartCount));
    if (d.restartCount > round_.restartCount) {
      DDPRUN_LOG(WARN, "launcher") << "restarting the worker group after rank " << rc.globalRank
                                   << " failed (" << rc.describe() << "): restart "
                                   << d.restartCount << " of " << options_.maxRestarts
                                   << " spent by this node";
    } else {
      DDPRUN_LOG(WARN, "launcher") << "rank " << rc.globalRank << " failed (" << rc.describe()
                                   << ") after the round had ended (a failure elsewhere spent "
                                   << "the restart): rejoining";
    }
    nextRound();
    return;
  }
  if (d.kind == JobDecision::Kind::Failed) {
    FailureReport report{.program = options_.program,
                         .host = agentHostName(),
                         .restartCount = std::max(round_.restartCount, recoveryRestarts_),
                         .round = round_.round,
                         .maxRestarts = options_.maxRestarts,
                         .rootCause = rc,
                         .pythonWorker = command_.python};
    for (const auto& r : group_->results()) {
      if (r.localRank != rc.localRank && r.failed() && !r.spare) report.others.push_back(r);
    }
    // Named only when there is something in it to read (RunDirectory keeps it only then).
    if (runDir_->temporary() && runDir_->holdsFiles()) report.keptDirectory = runDir_->path();
    Console::of(STDERR_FILENO).flush(kConsoleFlushBound);  // workers' lines before the report
    writeFully(STDERR_FILENO, formatFailureReport(report));
    events::instant("failure report", "agent",
                      events::Args().add("root_cause", "rank " + std::to_string(rc.globalRank) +
                                                             ": " + rc.describe()));
    errorRecord_ = workerErrorRecord(readErrorFile(rc.errorFile), rc);
    if (link_) link_->rootCause(rc, d.exitCode);
  }
  apply(d);
}

void Agent::Impl::apply(const JobDecision& d) {
  switch (d.kind) {
    case JobDecision::Kind::NextRound:
      nextRound();
      break;
    case JobDecision::Kind::Finished:
      endJob(0, d.summary);
      break;
    case JobDecision::Kind::Failed:
      endJob(d.exitCode, d.summary);
      break;
    case JobDecision::Kind::NodeLost:
      DDPRUN_CHECK(false, "a NodeLost decision comes only to the listener");
      break;
  }
}

bool Agent::Impl::localSuccess() const {
  if (!group_ || group_->results().empty()) return false;
  for (const auto& r : group_->results()) {
    if (r.spare) continue;  // a spare stopped with the group is no worker's result
    if (!r.ended || r.failed() || r.stopSignal != 0) return false;
  }
  return true;
}

void Agent::Impl::endJob(int code, const std::string& summary) {
  state_ = State::Closing;
  events::instant("job end", "agent",
                    events::Args().add("exit_code", code).add("summary", summary));
  if (code != 0 && errorRecord_.empty()) {
    // The job failed on another node: the reason every node reports.
    errorRecord_ = generatedErrorRecord(summary.empty() ? "the job failed" : summary, code);
  }
  if (!summary.empty()) writeFully(STDERR_FILENO, "ddprun: " + summary + "\n");
  auto shutdown = [this, code] {
    if (state_ != State::Closing) return;
    handler_->asyncShutdown([this, code](std::exception_ptr) {
      if (state_ == State::Closing) finish(code);
    });
  };
  if (!timelineAcrossNodes() || !group_) {
    shutdown();
  } else if (!timelineWriter()) {
    if (code == 0 && timelineShipped_) {
      // Shipped before the exit barrier, which the writer has passed too: it reads the bundles
      // now, so a second one would race its read (and with etcd-v3 the store it goes through
      // ends with the writer, which does not wait for this node).
      shutdown();
    } else {
      onExchange(shipTimeline(), shutdown);  // with the job's end: a failure's events
    }
  } else {
    // Before the shutdown: the store host (maybe this agent) keeps the store up until every
    // node has recorded the end, so the bundles are readable now. After a success each one
    // was shipped before the exit barrier; after a failure, a node still shipping has a while.
    const auto store = *timelineStore_;
    const std::string runId = timelineGroup();
    const int nodes = round_.nodeCount;
    auto collected = std::make_shared<timeline::Collected>();
    onExchange(
        [store, runId, nodes, collected] {
          *collected = timeline::collect(store, runId, nodes, std::chrono::seconds(5));
        },
        [this, collected, shutdown] {
          takeBundles(std::move(*collected));
          shutdown();
        });
  }
}

void Agent::Impl::takeBundles(timeline::Collected collected) {
  timelineBundles_ = std::move(collected.bundles);
  // What each node may hold: its agent's track and its own ranks'.
  for (auto& b : timelineBundles_) {
    if (b.nodeRank < 0 || b.nodeRank >= static_cast<int>(round_.nodeWorkers.size())) continue;
    b.firstRank = 0;
    for (int k = 0; k < b.nodeRank; ++k) b.firstRank += round_.nodeWorkers[k];
    b.ranks = round_.nodeWorkers[b.nodeRank];
  }
  timelineMissing_ = std::move(collected.missing);
}

bool Agent::Impl::timelineAcrossNodes() const {
  return !timelineParts_.empty() && exchange_ && round_.nodeCount > 1 && timelineStore_;
}

void Agent::Impl::onExchange(std::function<void()> job, std::function<void()> then) {
  exchange_->post([this, job = std::move(job), then = std::move(then)] {
    job();
    asio::post(io_, [this, then] { guarded(then); });
  });
}

std::function<void()> Agent::Impl::shipTimeline(
    std::optional<rendezvous::TcpStoreOptions> via) const {
  return [store = via ? *via : *timelineStore_, key = timeline::bundleKey(timelineGroup(), round_.nodeRank),
          bundle = timeline::BundleOptions{.partsDir = timelineParts_, .node = timelineNode_,
                                           .sinceUs = timelineSince_}] {
    timeline::ship(store, key, bundle);
  };
}

void Agent::Impl::leaveAndExit(int code, bool groupStopped) {
  state_ = State::Leaving;
  errorRecord_ = generatedErrorRecord("ddprun received " + signalName(signal_) + ": it stopped "
                                      "its workers and left the job", code);
  if (groupStopped) {
    events::instant("job end", "agent",
                    events::Args().add("exit_code", code).add(
                        "summary", signalName(signal_) + " on this node: it left the job"));
  }
  if (!groupStopped || !timelineAcrossNodes()) {
    leave(code);
    return;
  }
  // The signal stopped this node's running group (a job cancelled on every node gets it on
  // every node at once): the trace gets this node's events up to here, within a short bound
  // (a second signal cuts the wait for the exchange short; the ExchangeThread's join does not
  // outlast it).
  auto store = *timelineStore_;
  store.timeout = store.connectTimeout = kSignalExchangeCall;
  if (!timelineWriter()) {
    // An agent that hosts the store the writer reads (c10d) keeps it up until the writer says
    // it has read the bundles, or at most the writer's own bound.
    const bool hostsStore = handler_->hostedStorePort() != 0;
    onExchange(
        [ship = shipTimeline(store), hostsStore, store, group = timelineGroup()] {
          ship();
          if (hostsStore) {
            timeline::awaitCollected(store, group, kSignalCollectWait + kSignalExchangeCall);
          }
        },
        [this, code] {
          if (state_ == State::Leaving) leave(code);
        });
    return;
  }
  // The writer: the bundles of the nodes that stop now too, waited for at most
  // kSignalCollectWait (a node that goes on is named missing).
  const std::string runId = timelineGroup();
  const int nodes = round_.nodeCount;
  auto collected = std::make_shared<timeline::Collected>();
  onExchange(
      [store, runId, nodes, collected] {
        *collected = timeline::collect(store, runId, nodes, kSignalCollectWait);
      },
      [this, collected, code] {
        if (state_ != State::Leaving) return;
        takeBundles(std::move(*collected));
        leave(code);
      });
}

void Agent::Impl::leave(int code) {
  handler_->asyncLeave(signalName(signal_) + " on this node", [this, code](std::exception_ptr e) {
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        DDPRUN_LOG(WARN, "launcher") << "leaving the job: " << ex.what();
      } catch (...) {
        DDPRUN_LOG(WARN, "launcher") << "leaving the job failed";
      }
    }
    if (state_ == State::Leaving) finish(code);
  });
}

void Agent::Impl::finish(int code) {
  progressWatch_.reset();
  exitCode_ = code;
  state_ = State::Done;
  mergeTimeline();
  // The error files and logs a failure report points to must outlive ddprun (torchrun keeps
  // them too): a temporary run directory is deleted only after a success.
  if (code != 0 && runDir_) runDir_->keep();
  boost::system::error_code ec;
  signals_.cancel(ec);
  io_.stop();
}

void Agent::Impl::fail(std::exception_ptr e) {
  if (!error_) error_ = e;
  if (group_ && group_->runningCount() > 0 && state_ != State::Done) {
    // Stop the workers the usual way (signal, grace, SIGKILL); run() rethrows afterwards.
    if (state_ != State::Stopping) stopGroup(StopReason::Error, SIGTERM);
    stopReason_ = StopReason::Error;
    return;
  }
  finish(1);
}

void Agent::Impl::openTimeline() {
  if (options_.timeline.empty()) return;
  // Parts go next to FILE, in a directory per agent (two agents of the job may share a
  // machine and FILE): it and its workers write one file each.
  timelineParts_ = options_.timeline + ".parts/agent-" + std::to_string(::getpid());
  std::error_code ec;
  std::filesystem::create_directories(timelineParts_, ec);
  if (ec) {
    throw ConfigError("--timeline=" + options_.timeline + ": cannot create " + timelineParts_ +
                      ": " + ec.message());
  }
  timelineSince_ = events::nowUs();
  env_[events::kTimelineDirEnv] = timelineParts_;
  const std::string node = options_.localAddr.empty() ? agentHostName() : options_.localAddr;
  timelineNode_ = "agent " + node;
  events::open(timelineParts_, timelineNode_, "agent");
  // Idle unless the job spans several nodes (it ships and collects their events).
  exchange_ = std::make_unique<timeline::ExchangeThread>();
}

void Agent::Impl::mergeTimeline() {
  if (timelineParts_.empty()) return;
  // On several nodes only node rank 0's agent writes FILE (the others ship their events to it).
  if (timelineAcrossNodes() && !timelineWriter()) return;
  try {
    const auto r = timeline::mergeTimeline({.partsDir = timelineParts_,
                                            .output = options_.timeline,
                                            .sinceUs = timelineSince_,
                                            .bundles = timelineBundles_,
                                            .missingNodes = timelineMissing_});
    DDPRUN_LOG(DEBUG, "launcher") << "timeline: " << r.events << " events of " << r.tracks
                                  << " tracks written to " << options_.timeline
                                  << " (clock offset bound " << r.offsetBoundUs << " us)";
    if (!r.refused.empty()) {
      DDPRUN_LOG(WARN, "launcher") << "timeline: refused " << r.badBundles << " bundle(s) and "
                                   << r.refusedTracks << " track(s) other nodes sent (first: "
                                   << r.refused.front() << "); " << options_.timeline
                                   << " says otherData.refused";
    }
    if (r.partsCut > 0) {
      DDPRUN_LOG(WARN, "launcher") << "timeline: " << r.partsCut
                                   << " part file(s) read only in part (256 MiB a file, 512 MiB "
                                      "in all); " << options_.timeline << " says parts_cut";
    }
  } catch (const std::exception& e) {
    DDPRUN_LOG(WARN, "launcher") << "timeline: " << e.what();
  }
}

}  // namespace ddprun::launcher
