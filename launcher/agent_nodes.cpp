// In-process recovery on several nodes (docs/recovery.md#several-nodes). With the agent store,
// node rank 0's agent hosts the store every node's workers meet in; a worker's death is healed
// by the agent of its node, and the others keep their processes.
//
// Who writes a generation: the agent of the dead worker's node. Its number comes from an ADD on
// ddprun/generation_counter in the workers' store, so two agents recovering at once never get the
// same number; and each writer waits (bounded) for record g-1 before it writes g, so the records
// appear in order, as the workers read them (they apply every record between theirs and the
// newest). Why not node 0's agent on behalf of the others: a request and its answer would cost a
// round trip more on the recovery's path of every other node, and node 0 would need every node's
// books; the writer of a shrink needs only its dead worker's rank in generation g-1 and each
// node's worker count, which it folds from the records before g (its own books may lag).
// Every agent follows the records (WorkerStoreLink): a shrink renumbers its own workers (ranks
// stay in node order) for their console prefix and the progress watch.
#include "launcher/agent_impl.h"

#include <sstream>

namespace ddprun::launcher {

namespace keys = rendezvous::recovery;

std::vector<int> parseCounts(const std::string& text) {
  std::vector<int> v;
  std::istringstream in(text);
  for (std::string x; std::getline(in, x, ',');) v.push_back(std::atoi(x.c_str()));
  return v;
}

namespace {
std::string formatCounts(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}
constexpr rendezvous::Millis kPreviousRecordWait{30'000};

// Why the death of a rank moved here from a lost node is not recovered in process.
std::string movedWithoutSpare(const WorkerResult& r) {
  return "rank " + std::to_string(r.globalRank) + " had moved to this node from a lost node, and "
         "no spare of this node is waiting to take it (a new process is not started in process "
         "for a slot after the node's own)";
}

// The same after the budget: a spare was waiting when the death was checked (checkAcrossNodes
// refuses otherwise), and none is by the time the recovery would give it the rank.
std::string movedSpareGone(const WorkerResult& r) {
  return "rank " + std::to_string(r.globalRank) + " had moved to this node from a lost node, and "
         "the spare of this node that was waiting to take it died (or was not started again) "
         "in the milliseconds since the death was checked";
}
}  // namespace

std::string awaitRecord(rendezvous::Store& s, int g) {
  try {
    s.wait({keys::generationKey(g)}, kPreviousRecordWait);
  } catch (const TimeoutError&) {
    throw TimeoutError("generation " + std::to_string(g) + "'s record did not appear within " +
                       std::to_string(kPreviousRecordWait.count() / 1000) + " s (its writer, " +
                       "another node's agent, is gone?)");
  }
  return s.get(keys::generationKey(g));
}

bool Agent::Impl::acrossNodes() const {
  return round_.nodeCount > 1 && round_.useAgentStore && linkWanted_ &&
         options_.recovery != LaunchOptions::Recovery::Restart;
}

void Agent::Impl::openStoreLink() {
  storeLink_.reset();
  ++linkEpoch_;
  nodeCounts_.clear();
  lostNodes_.clear();
  movedTo_.clear();
  worldNow_ = round_.worldSize;
  linkWanted_ = round_.nodeCount > 1 && round_.useAgentStore &&
                options_.recovery != LaunchOptions::Recovery::Restart;
  learnNodeWorkers();
  if (!linkWanted_) return;
  if (progressTablePath().empty()) storeLink();  // no progress watch to say when
}

void Agent::Impl::learnNodeWorkers() {
  if (round_.nodeRank != 0 || round_.nodeCount < 2) return;
  if (!linkWanted_ && timelineParts_.empty()) return;  // nobody here needs them
  if (static_cast<int>(round_.nodeWorkers.size()) == round_.nodeCount) {
    takeNodeWorkers(round_.nodeWorkers);
    return;
  }
  const int epoch = linkEpoch_;
  handler_->asyncNodeWorkers(round_, [this, epoch](std::vector<int> counts) {
    if (epoch != linkEpoch_ || static_cast<int>(counts.size()) != round_.nodeCount) return;
    takeNodeWorkers(std::move(counts));
  });
}

void Agent::Impl::takeNodeWorkers(std::vector<int> counts) {
  round_.nodeWorkers = counts;
  auto* store = linkWanted_ ? handler_->workerStore() : nullptr;
  if (!store) return;
  // For the writers of shrink records (they read it when their own books lack the counts).
  store->set(keys::attemptPrefix(round_.restartCount) + "/" + keys::nodeWorkersKey(),
             formatCounts(counts));
  // A shrink record applied meanwhile brought newer counts: keep those.
  if (nodeCounts_.empty()) nodeCounts_ = std::move(counts);
}

WorkerStoreLink& Agent::Impl::storeLink() {
  DDPRUN_CHECK(linkWanted_, "the workers' store link of a group that has none");
  if (storeLink_) return *storeLink_;
  const std::string prefix = keys::attemptPrefix(round_.restartCount);
  std::string host = round_.masterAddr;  // "[::1]" -> "::1"
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const int epoch = linkEpoch_;
  storeLink_ = std::make_unique<WorkerStoreLink>(
      io_,
      rendezvous::TcpStoreOptions{.host = host, .port = round_.masterPort,
                                  .timeout = rendezvous::Millis(30'000),
                                  .connectTimeout = rendezvous::Millis(10'000),
                                  .dialect = rendezvous::StoreDialect::Ddprun,
                                  .tokenFromEnvironment = false},
      prefix, [this, epoch](int g, const std::string& text) {
        guarded([&] {
          if (epoch == linkEpoch_) onGenerationRecord(g, text);
        });
      });
  return *storeLink_;
}

void Agent::Impl::onGenerationRecord(int g, const std::string& text) {
  if (state_ != State::Running || !group_ || g <= generation_) return;
  generation_ = g;
  const auto record = keys::parseGenerationRecord(text);
  if (!record) {
    DDPRUN_LOG(WARN, "launcher") << "generation " << g << " of the worker group: a record this "
                                 << "agent does not read ('" << text.substr(0, 80) << "')";
    return;
  }
  const bool own = ownGenerations_.count(g) > 0;
  // A lost node's ranks taken by spares: this node's named spares take theirs.
  for (size_t i = 0; i < record->moved.size(); ++i) {
    const auto& m = record->moved[i];
    movedTo_[record->replaced[i]] = m.node;
    if (m.node == round_.nodeRank) takeMovedRank(g, record->replaced[i], m.spare, record->cause);
  }
  if (state_ != State::Running || !group_) return;  // a spare gone: the group is stopping
  if (!record->removed.empty()) {
    // Shrink: this node's workers keep their order, renumbered as every worker renumbers.
    std::vector<std::pair<pid_t, int>> renumbered;
    for (const auto& w : group_->results()) {
      if (w.ended || w.spare) continue;
      const int rank = keys::shrinkRank(w.globalRank, record->removed);
      if (rank >= 0 && rank != w.globalRank) renumbered.emplace_back(w.pid, rank);
    }
    for (const auto& [pid, rank] : renumbered) {
      for (const auto& w : group_->results()) {
        if (w.pid == pid && !w.ended) group_->setPrefix(pid, prefixFor(rank, w.localRank));
      }
      group_->renumber(pid, rank);
    }
    worldNow_ = record->worldSize;
    if (!record->nodes.empty()) nodeCounts_ = record->nodes;
    watchProgress();
  }
  if (!own) {
    DDPRUN_LOG(INFO, "launcher") << "generation " << g << " of the worker group (another node "
                                 << "recovered in process; this node's workers keep running): "
                                 << record->cause;
  }
}

void Agent::Impl::checkAcrossNodes(const WorkerResult& r) {
  // Whether every rank of the group holds the training state, read in the workers' store off
  // this thread: this node's survivors in the generation their process started in, every other
  // rank in any (their agents started them), and the dead rank's program runs the elastic loop.
  // Another death of this node meanwhile (addPendingDeath) makes it a restart.
  recoveryPending_ = true;
  pendingDeaths_ = {r};
  struct Local {
    int rank;
    int since;
    pid_t pid;
  };
  std::vector<Local> local;
  for (const auto& w : group_->results()) {
    if (w.ended || w.spare || w.pid == r.pid) continue;
    const size_t lr = static_cast<size_t>(w.localRank);
    local.push_back({w.globalRank, lr < startedGeneration_.size() ? startedGeneration_[lr] : 0, w.pid});
  }
  const int world = worldNow_;
  auto why = std::make_shared<std::string>();
  // Whether a rank announced in-process recovery (read when the check fails): auto had chosen
  // it for this group, so a refusal is said under auto too.
  auto announced = std::make_shared<bool>(generation_ > 0 || sparesStarted_);
  const int epoch = linkEpoch_;
  // The dead rank, its generation and each node's worker count as this agent knows them now
  // (a shrink's writer folds the records after them).
  deathRank_ = r.globalRank;
  deathGeneration_ = generation_;
  deathCounts_ = nodeCounts_;
  storeLink().run(
      [why, announced, local, world, dead = r.globalRank](rendezvous::Store& s) {
        // One other rank is evidence enough (the ranks announce together, after DDP's first
        // broadcast), and a program without the runtime costs one round trip, not one per rank.
        auto anyAnnounced = [&] {
          const int other = dead == 0 ? 1 : 0;
          if (!*announced && other < world) *announced = s.check({keys::announceKey(other)});
        };
        if (!s.check({keys::announceKey(dead)})) {
          *why = "rank " + std::to_string(dead) + " had not announced in-process recovery (its "
                 "program does not run the runtime's elastic loop, or it died before it held "
                 "the training state)";
          anyAnnounced();
          return;
        }
        *announced = true;
        for (int rank = 0; rank < world; ++rank) {
          if (rank == dead) continue;
          const Local* mine = nullptr;
          for (const auto& l : local) mine = l.rank == rank ? &l : mine;
          if (!s.check({keys::announceKey(rank)}) ||
              (mine && std::atoi(s.get(keys::announceKey(rank)).c_str()) < mine->since)) {
            *why = "rank " + std::to_string(rank) +
                   (mine ? " (pid " + std::to_string(mine->pid) + ")" : std::string(" (another node)")) +
                   " does not hold the training state yet";
            return;
          }
        }
      },
      [this, r, why, announced, epoch, world](const std::string& error) {
        guarded([&] {
          if (epoch != linkEpoch_ || state_ != State::Running) return;
          recoveryPending_ = false;
          std::string refused = !error.empty() ? "the workers' store could not be read (" + error + ")"
                                               : *why;
          if (refused.empty() && pendingDeaths_.size() > 1) refused = "another worker of this node died meanwhile";
          if (refused.empty() && world - 1 < 1) refused = "no worker survived to heal a replacement from";
          // Decided before the budget: a restart spent on a recovery that replaceAcross then
          // cannot make would be followed by the group's restart, a second one for one death.
          if (refused.empty() && options_.recoveryPolicy != LaunchOptions::RecoveryPolicy::Shrink &&
              r.localRank >= options_.nprocPerNode && !spareToPick()) {
            refused = movedWithoutSpare(r);
          }
          if (refused.empty() && options_.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink &&
              world - 1 < options_.shrinkMinRanks) {
            DDPRUN_LOG(WARN, "launcher") << "--recovery-policy=shrink: without rank " << r.globalRank
                                         << " the group would have " << world - 1 << " rank(s), "
                                         << "below the job's minimum of " << options_.shrinkMinRanks
                                         << "; restarting the group instead";
          } else if (refused.empty()) {
            recoverInProcess(r);
            return;
          } else if (const std::string mode = recoveryMode(*announced); !mode.empty()) {
            DDPRUN_LOG(WARN, "launcher") << mode << ": " << refused
                                         << "; restarting the group instead";
          }
          pendingDeaths_.clear();
          rootCause_ = r;
          DDPRUN_LOG(ERROR, "launcher") << "rank " << r.globalRank << " (local rank " << r.localRank
                                        << ", pid " << r.pid << ") failed: " << r.describe()
                                        << "; stopping the other workers";
          stopGroup(StopReason::WorkerFailed, SIGTERM);
        });
      });
}

void Agent::Impl::failAcross(const WorkerResult& r, const std::string& error) {
  pendingDeaths_.clear();
  // The generation could not be published: the group restarts, a failure reported afresh (the
  // round must end for every node), spending no restart more than the recovery did.
  DDPRUN_LOG(ERROR, "launcher") << "in-process recovery of rank " << r.globalRank << " failed: "
                                << error << "; restarting the group";
  rootCause_ = r;
  recoverySpentRestart_ = true;
  stopGroup(StopReason::WorkerFailed, SIGTERM);
}

void Agent::Impl::startSparesAcross() {
  std::vector<std::string> announced;
  for (int lr = 0; lr < options_.nprocPerNode; ++lr) {
    announced.push_back(keys::announceKey(round_.rankOffset + lr));
  }
  const int epoch = linkEpoch_;
  storeLink().waitFor(std::move(announced), [this, epoch] {
    guarded([&] {
      if (epoch != linkEpoch_ || state_ != State::Running || sparesStarted_) return;
      backgroundIdle();  // decided now, for the spares started later
      sparesStarted_ = true;
      startSpareTemplate(/*idle=*/false);  // first: the spares started once it is loaded are forks of it
      for (int i = 0; i < options_.spares; ++i) startSpare(/*idle=*/false);
    });
  });
}

void Agent::Impl::replaceAcross(const WorkerResult& r, const JobDecision& d) {
  if (r.localRank >= options_.nprocPerNode && !spareToPick()) {
    // A rank moved here from a lost node: a new process for it would need the environment of
    // a slot this node's launch does not describe; a waiting spare takes it, or the group
    // restarts.
    recoveryRestarts_ = d.restartCount;
    failAcross(r, movedSpareGone(r));
    return;
  }
  recoveryRestarts_ = d.restartCount;
  recoveryPending_ = true;  // until the generation is published: another death restarts
  pendingDeaths_ = {r};
  const int lr = r.localRank;
  const std::string table = progressTablePath();
  if (!table.empty()) {
    progressTable_->reset(lr, FreezePolicy::heartbeatPeriodMs(options_.peerTimeout));
  }
  auto generation = std::make_shared<int>(0);
  const int epoch = linkEpoch_;
  // Which waiting spare takes the rank: a ready one first (pickSpare). This agent does not see
  // the spares' ready keys set in node rank 0's store, so with two or more to choose from and
  // none seen ready yet, the same link job that draws the generation number reads their keys in
  // start order up to the first set one: no turn of the link more, on loopback a request or
  // two more in it (a set key stays set: sparesSeenReady_ keeps it for the next recovery).
  // Not watched as the spares announce readiness: they announce it only in node rank 0's store,
  // and a watch there (storeLink().waitFor) costs a thread and a connection of its own per
  // spare, and stays until the link goes for a spare that dies before it is ready.
  const std::vector<int> unread = spareReadyKeysToRead();
  auto seenReady = std::make_shared<std::vector<int>>();
  storeLink().run(
      [generation, unread, seenReady](rendezvous::Store& s) {
        *generation = static_cast<int>(s.add(keys::generationCounterKey(), 1));
        for (const int id : unread) {
          if (!s.check({keys::spareReadyKey(id)})) continue;
          seenReady->push_back(id);
          break;
        }
      },
      [this, r, d, generation, seenReady, epoch, lr](const std::string& error) {
        guarded([&] {
          if (epoch != linkEpoch_ || state_ != State::Running) return;
          if (!error.empty()) {
            recoveryPending_ = false;
            failAcross(r, error);
            return;
          }
          sparesSeenReady_.insert(seenReady->begin(), seenReady->end());
          const int g = *generation;
          ownGenerations_.insert(g);
          // A waiting spare of this node takes the rank, else a new process (it builds
          // generation g's communicator).
          int spareId = -1;
          pid_t sparePid = sparesStarted_ ? pickSpare(spareId) : -1;
          if (sparePid > 0 && group_->assign(sparePid, lr, r.globalRank)) {
            group_->setPrefix(sparePid, prefixFor(r.globalRank, lr));
            if (schedulingPolicy(sparePid) == SCHED_IDLE) {
              std::string idleError;
              leaveIdlePriority(sparePid, idleError);
            }
          } else if (lr >= options_.nprocPerNode) {
            // A moved rank's spare died since the check above: a new process would get the
            // environment of a slot this node's launch does not describe (another rank's, or
            // none). The group restarts instead (generation g is never written: the restart
            // ends the attempt whose records would wait for it).
            recoveryPending_ = false;
            failAcross(r, movedSpareGone(r));
            return;
          } else {
            spareId = -1;
            sparePid = -1;
            group_->add(makeLaunch(round_, lr, g));
          }
          startedGeneration_[static_cast<size_t>(lr)] = g;
          const std::string cause = "rank " + std::to_string(r.globalRank) + " (pid " +
                                    std::to_string(r.pid) + ") on node " +
                                    std::to_string(round_.nodeRank) + " failed: " + r.describe();
          const std::string text = keys::formatGenerationRecord(
              {.generation = g, .replaced = {r.globalRank}, .cause = cause, .spare = spareId});
          const std::string assignment =
              spareId < 0 ? std::string()
                          : keys::formatSpareAssignment(
                                {.generation = g,
                                 .rank = r.globalRank,
                                 .localRank = lr,
                                 .localWorldSize = lr >= options_.nprocPerNode ? lr + 1 : 0});
          if (spareId >= 0) publishSpares();
          storeLink().run(
              [g, text, spareId, assignment](rendezvous::Store& s) {
                if (spareId >= 0) s.set(keys::spareAssignKey(spareId), assignment);
                if (g > 1) awaitRecord(s, g - 1);
                s.set(keys::generationKey(g), text);
              },
              [this, r, epoch](const std::string& error) {
                guarded([&] {
                  if (epoch != linkEpoch_ || state_ != State::Running) return;
                  recoveryPending_ = false;
                  if (!error.empty()) {
                    failAcross(r, error);
                  } else if (pendingDeaths_.size() > 1) {
                    failAcross(r, "another worker of this node died during the recovery");
                  }
                });
              });
          events::instant("recovery", "agent",
                          events::Args()
                              .add("cause", cause)
                              .add("generation", g)
                              .add("rank", r.globalRank)
                              .add("restarts_spent", d.restartCount));
          const std::string taker =
              spareId >= 0 ? "spare " + std::to_string(spareId) + " (pid " +
                                 std::to_string(sparePid) + ") takes rank " +
                                 std::to_string(r.globalRank)
                           : "a new rank " + std::to_string(r.globalRank) + " is starting";
          DDPRUN_LOG(WARN, "launcher") << "rank " << r.globalRank << " (local rank " << lr
                                       << ", pid " << r.pid << ") failed: " << r.describe()
                                       << "; recovering in process (generation " << g
                                       << "): the other workers of every node keep running, "
                                       << taker << " (restart " << d.restartCount << " of "
                                       << options_.maxRestarts << " spent)";
          if (spareId >= 0) {
            events::instant("spare assign", "agent",
                            events::Args()
                                .add("spare", spareId)
                                .add("pid", static_cast<int64_t>(sparePid))
                                .add("rank", r.globalRank)
                                .add("local_rank", lr)
                                .add("generation", g));
            startSpare(/*idle=*/idleSpares_ == 1);  // in the background: the next failure's
          }
          watchProgress();
        });
      });
}

void Agent::Impl::shrinkAcross(const WorkerResult& r, const JobDecision& d) {
  recoveryRestarts_ = d.restartCount;
  recoveryPending_ = true;
  pendingDeaths_ = {r};
  struct Out {
    int generation = 0;
    int before = 0;
    int after = 0;
    int rank = -1;
  };
  auto out = std::make_shared<Out>();
  const int epoch = linkEpoch_;
  const int node = round_.nodeRank;
  const int nodeCount = round_.nodeCount;
  const std::string cause = "rank " + std::to_string(r.globalRank) + " (pid " +
                            std::to_string(r.pid) + ") on node " + std::to_string(node) +
                            " failed: " + r.describe();
  storeLink().run(
      [out, known = deathGeneration_, rank = deathRank_, counts = deathCounts_, node, nodeCount,
       cause](rendezvous::Store& s) mutable {
        const int g = static_cast<int>(s.add(keys::generationCounterKey(), 1));
        out->generation = g;
        // The dead rank and each node's count in generation g-1, from what this agent knew.
        for (int k = known + 1; k < g; ++k) {
          const auto rec = keys::parseGenerationRecord(awaitRecord(s, k));
          if (!rec) throw Error("generation " + std::to_string(k) + "'s record is not a replace or shrink record");
          if (rec->removed.empty()) continue;
          rank = keys::shrinkRank(rank, rec->removed);
          if (rank < 0) throw Error("the dead rank was removed by generation " + std::to_string(k));
          if (!rec->nodes.empty()) counts = rec->nodes;
        }
        if (g > 1 && known + 1 >= g) awaitRecord(s, g - 1);  // written in order
        if (static_cast<int>(counts.size()) != nodeCount) {
          counts = parseCounts(s.get(keys::nodeWorkersKey()));
          if (static_cast<int>(counts.size()) != nodeCount) {
            throw Error("ddprun/node_workers names " + std::to_string(counts.size()) +
                        " node(s), the round has " + std::to_string(nodeCount));
          }
        }
        int before = 0;
        for (int c : counts) before += c;
        DDPRUN_CHECK(counts[static_cast<size_t>(node)] > 0, "the dead worker's node has workers");
        counts[static_cast<size_t>(node)] -= 1;
        out->before = before;
        out->after = before - 1;
        out->rank = rank;
        s.set(keys::generationKey(g),
              keys::formatGenerationRecord({.generation = g,
                                            .cause = cause,
                                            .removed = {rank},
                                            .worldSize = before - 1,
                                            .nodes = counts}));
      },
      [this, r, d, out, epoch, cause](const std::string& error) {
        guarded([&] {
          if (epoch != linkEpoch_ || state_ != State::Running) return;
          recoveryPending_ = false;
          if (!error.empty() || pendingDeaths_.size() > 1) {
            failAcross(r, !error.empty() ? error
                                         : "another worker of this node died during the recovery");
            return;
          }
          ownGenerations_.insert(out->generation);
          events::instant("recovery", "agent",
                          events::Args()
                              .add("cause", cause)
                              .add("generation", out->generation)
                              .add("rank", out->rank)
                              .add("policy", "shrink")
                              .add("world_size", out->after)
                              .add("restarts_spent", d.restartCount));
          DDPRUN_LOG(WARN, "launcher") << "rank " << out->rank << " (local rank " << r.localRank
                                       << ", pid " << r.pid << ") failed: " << r.describe()
                                       << "; recovering in process (generation "
                                       << out->generation << "): the group shrinks from "
                                       << out->before << " to " << out->after
                                       << " rank(s), the others of every node keep running "
                                       << "(restart " << d.restartCount << " of "
                                       << options_.maxRestarts << " spent)";
        });
      });
}

}  // namespace ddprun::launcher
