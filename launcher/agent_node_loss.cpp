// In-process recovery of a lost node (docs/recovery.md#a-lost-node), node rank 0's agent. The
// rendezvous keeps the round when a member other than node rank 0 is evicted
// (JobLimits::keepRoundOnNodeLoss) and this agent's round watcher tells it
// (JobDecision::NodeLost). It is the one writer of that generation: it hosts the workers'
// store, and the lost node's agent, which writes its own node's generations, is gone.
#include "launcher/agent_impl.h"

namespace ddprun::launcher {

namespace keys = rendezvous::recovery;

void Agent::Impl::reformWithoutNode(const std::string& what, const std::string& why,
                                    bool spent) {
  DDPRUN_LOG(WARN, "launcher") << what << "; it is not recovered in process: " << why
                               << "; restarting the group without it ("
                               << (spent ? "the restart this recovery spent stays spent"
                                         : "no restart spent")
                               << ")";
  const int epoch = linkEpoch_;
  handler_->asyncReportNodeLoss(what, /*inProcess=*/false,
                                [this, epoch](std::exception_ptr e, JobDecision d) {
                                  guarded([&] {
                                    // A lost store: its StoreLost decision ends the job.
                                    if (e && handler_->storeLost()) return;
                                    if (e) std::rethrow_exception(e);
                                    if (epoch != linkEpoch_ || state_ != State::Running) return;
                                    onHandlerDecision(d);
                                  });
                                });
}

std::vector<keys::MovedRank> readySpares(rendezvous::Store& s, int nodes,
                                        const std::set<int>& lost, int wanted) {
  // Node by node from 0 (this node's first): each node's agent lists its waiting spares
  // (publishSpares); a spare is ready once its runtime set its ready key, and free while no
  // assignment names it. Read by one writer in one job, so no spare is named twice.
  std::vector<keys::MovedRank> found;
  for (int n = 0; n < nodes && static_cast<int>(found.size()) < wanted; ++n) {
    if (lost.count(n) > 0 || !s.check({keys::nodeSparesKey(n)})) continue;
    for (int id : parseCounts(s.get(keys::nodeSparesKey(n)))) {
      if (static_cast<int>(found.size()) >= wanted) break;
      if (s.check({keys::spareReadyKey(id)}) && !s.check({keys::spareAssignKey(id)})) {
        found.push_back({.node = n, .spare = id});
      }
    }
  }
  return found;
}

bool Agent::Impl::nodeLossPublished(int node, int epoch, const std::string& error) {
  if (epoch != linkEpoch_ || state_ != State::Running) return false;
  nodeLossPending_ = false;
  if (error.empty()) return true;
  // The restart stays spent; the round must end for every node.
  reformWithoutNode("node rank " + std::to_string(node) + " was lost",
                    "its generation could not be published (" + error + ")", /*spent=*/true);
  return false;
}

void Agent::Impl::onNodeLost(const JobDecision& d) {
  const int k = d.lostNode;
  const std::string what = "node rank " + std::to_string(k) + " (" + d.lostId + ") was lost";
  if (state_ != State::Running || !group_) {
    // Stopping, joining or in the exit barrier: the round's end (this node's report, or the
    // barrier, which counts the lost node) decides.
    DDPRUN_LOG(INFO, "launcher") << what << " while this node's group was not running";
    return;
  }
  std::string why;
  const size_t nodes = nodeCounts_.size();
  if (!acrossNodes()) {
    why = "in-process recovery across nodes needs the agent store and --recovery=auto or "
          "in-process";
  } else if (nodeLossPending_) {
    why = "the loss of another node is being recovered";
  } else if (k <= 0 || static_cast<size_t>(k) >= nodes ||
             nodeCounts_[static_cast<size_t>(k)] <= 0) {
    why = "its worker count in the group is not known to this agent";
  } else if (options_.recoveryPolicy != LaunchOptions::RecoveryPolicy::Shrink &&
             options_.spares <= 0) {
    why = "--recovery-policy=replace gives a lost node's ranks to ready spares of the other "
          "nodes, and this job has none (--spares=0; or use --recovery-policy=shrink)";
  } else if (options_.recoveryPolicy == LaunchOptions::RecoveryPolicy::Shrink &&
             worldNow_ - nodeCounts_[static_cast<size_t>(k)] < options_.shrinkMinRanks) {
    why = "--recovery-policy=shrink: without its " +
          std::to_string(nodeCounts_[static_cast<size_t>(k)]) + " rank(s) the group would have " +
          std::to_string(worldNow_ - nodeCounts_[static_cast<size_t>(k)]) +
          ", below the job's minimum of " + std::to_string(options_.shrinkMinRanks);
  }
  if (!why.empty()) {
    reformWithoutNode(what, why);
    return;
  }
  // Every surviving rank must hold the training state (it announced it): read off this thread.
  // Under replace, also the ready spares of the other nodes that would take the lost ranks.
  int first = 0;
  for (int n = 0; n < k; ++n) first += nodeCounts_[static_cast<size_t>(n)];
  int count = nodeCounts_[static_cast<size_t>(k)];
  // Under replace the node may also hold ranks moved to it from a node lost before.
  std::vector<int> lostRanks;
  for (int r = first; r < first + count; ++r) lostRanks.push_back(r);
  for (const auto& [rank, node] : movedTo_) {
    if (node == k) lostRanks.push_back(rank);
  }
  std::set<int> lostNodes = lostNodes_;
  lostNodes.insert(k);
  const int world = worldNow_;
  const bool replace = options_.recoveryPolicy != LaunchOptions::RecoveryPolicy::Shrink;
  auto missing = std::make_shared<std::string>();
  auto takers = std::make_shared<std::vector<keys::MovedRank>>();
  const int epoch = linkEpoch_;
  const std::string cause = "node rank " + std::to_string(k) + " was lost: " + d.reason;
  storeLink_->run(
      [missing, takers, lostRanks, world, replace, nodes, lost = lostNodes](
          rendezvous::Store& s) {
        for (int rank = 0; rank < world; ++rank) {
          if (std::find(lostRanks.begin(), lostRanks.end(), rank) != lostRanks.end()) continue;
          if (!s.check({keys::announceKey(rank)})) {
            *missing = "rank " + std::to_string(rank) + " does not hold the training state yet";
            return;
          }
        }
        if (!replace) return;
        const int wanted = static_cast<int>(lostRanks.size());
        *takers = readySpares(s, static_cast<int>(nodes), lost, wanted);
        if (static_cast<int>(takers->size()) < wanted) {
          *missing = "--recovery-policy=replace: its " + std::to_string(wanted) +
                     " rank(s) need as many ready spares on the other nodes, " +
                     std::to_string(takers->size()) + " are ready";
        }
      },
      [this, k, what, cause, missing, takers, epoch, replace, lostRanks](const std::string& error) {
        guarded([&] {
          if (epoch != linkEpoch_ || state_ != State::Running) return;
          if (!error.empty() || !missing->empty()) {
            reformWithoutNode(what, !error.empty() ? "the workers' store could not be read (" +
                                                         error + ")"
                                                   : *missing);
            return;
          }
          // A death of this node's workers meanwhile is a recovery of its own, as on two nodes
          // at once: the generation counter orders the two records.
          nodeLossPending_ = true;
          handler_->asyncReportNodeLoss(
              cause, /*inProcess=*/true,
              [this, k, cause, epoch, replace, takers, lostRanks](std::exception_ptr e,
                                                                  JobDecision dec) {
                guarded([&] {
                  if (e && handler_->storeLost()) return;  // its StoreLost decision ends the job
                  if (e) std::rethrow_exception(e);
                  if (epoch != linkEpoch_ || state_ != State::Running) return;
                  if (!dec.recovered) {
                    nodeLossPending_ = false;
                    onHandlerDecision(dec);  // the round ended meanwhile, or no restart is left
                    return;
                  }
                  if (replace) {
                    replaceLostNode(k, cause, dec, lostRanks, *takers);
                  } else {
                    shrinkLostNode(k, cause, dec);
                  }
                });
              });
        });
      });
}

void Agent::Impl::shrinkLostNode(int node, const std::string& cause, const JobDecision& d) {
  recoveryRestarts_ = d.restartCount;
  struct Out {
    int generation = 0;
    int before = 0;
    std::vector<int> removed;
  };
  auto out = std::make_shared<Out>();
  const int epoch = linkEpoch_;
  storeLink_->run(
      [out, known = generation_, counts = nodeCounts_, node, nodeCount = round_.nodeCount,
       cause](rendezvous::Store& s) mutable {
        const int g = static_cast<int>(s.add(keys::generationCounterKey(), 1));
        out->generation = g;
        // Each node's count in generation g-1: the records after the one this agent applied.
        for (int k = known + 1; k < g; ++k) {
          const auto rec = keys::parseGenerationRecord(awaitRecord(s, k));
          if (!rec) {
            throw Error("generation " + std::to_string(k) +
                        "'s record is not a replace or shrink record");
          }
          if (!rec->removed.empty() && !rec->nodes.empty()) counts = rec->nodes;
        }
        if (g > 1 && known + 1 >= g) awaitRecord(s, g - 1);  // written in order
        if (static_cast<int>(counts.size()) != nodeCount) {
          counts = parseCounts(s.get(keys::nodeWorkersKey()));
          if (static_cast<int>(counts.size()) != nodeCount) {
            throw Error("ddprun/node_workers names " + std::to_string(counts.size()) +
                        " node(s), the round has " + std::to_string(nodeCount));
          }
        }
        // Ranks stay in node order: the lost node's are the block after the nodes before it.
        int before = 0, first = 0;
        for (int n = 0; n < nodeCount; ++n) {
          if (n < node) first += counts[static_cast<size_t>(n)];
          before += counts[static_cast<size_t>(n)];
        }
        const int count = counts[static_cast<size_t>(node)];
        if (count <= 0) throw Error("node rank " + std::to_string(node) + " has no workers left");
        for (int r = first; r < first + count; ++r) out->removed.push_back(r);
        counts[static_cast<size_t>(node)] = 0;
        out->before = before;
        s.set(keys::generationKey(g),
              keys::formatGenerationRecord({.generation = g,
                                            .cause = cause,
                                            .removed = out->removed,
                                            .worldSize = before - count,
                                            .nodes = counts}));
      },
      [this, node, d, out, epoch, cause](const std::string& error) {
        guarded([&] {
          if (!nodeLossPublished(node, epoch, error)) return;
          ownGenerations_.insert(out->generation);
          const int after = out->before - static_cast<int>(out->removed.size());
          std::string ranks;
          for (int r : out->removed) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
          events::instant("recovery", "agent",
                          events::Args()
                              .add("cause", cause)
                              .add("generation", out->generation)
                              .add("lost_node", node)
                              .add("policy", "shrink")
                              .add("world_size", after)
                              .add("restarts_spent", d.restartCount));
          DDPRUN_LOG(WARN, "launcher") << cause << "; recovering in process (generation "
                                       << out->generation << "): its rank(s) " << ranks
                                       << " are removed, the group shrinks from " << out->before
                                       << " to " << after << " rank(s), the workers of every "
                                       << "other node keep running (restart " << d.restartCount
                                       << " of " << options_.maxRestarts << " spent)";
        });
      });
}

void Agent::Impl::replaceLostNode(int node, const std::string& cause, const JobDecision& d,
                                  const std::vector<int>& ranks,
                                  const std::vector<keys::MovedRank>& takers) {
  recoveryRestarts_ = d.restartCount;
  auto generation = std::make_shared<int>(0);
  const int epoch = linkEpoch_;
  // One record names every taker; each named node's agent hands the rank to its spare when its
  // follower reads it (takeMovedRank), as it reads every record.
  storeLink_->run(
      [generation, ranks, takers, cause](rendezvous::Store& s) {
        const int g = static_cast<int>(s.add(keys::generationCounterKey(), 1));
        *generation = g;
        if (g > 1) awaitRecord(s, g - 1);  // written in order
        s.set(keys::generationKey(g),
              keys::formatGenerationRecord(
                  {.generation = g, .replaced = ranks, .cause = cause, .moved = takers}));
      },
      [this, node, d, ranks, takers, generation, epoch, cause](const std::string& error) {
        guarded([&] {
          if (!nodeLossPublished(node, epoch, error)) return;
          lostNodes_.insert(node);
          ownGenerations_.insert(*generation);
          std::string taken;
          for (size_t i = 0; i < ranks.size(); ++i) {
            taken += (taken.empty() ? "" : ", ") + std::string("rank ") +
                     std::to_string(ranks[i]) + " by spare " + std::to_string(takers[i].spare) +
                     " of node rank " + std::to_string(takers[i].node);
          }
          events::instant("recovery", "agent",
                          events::Args()
                              .add("cause", cause)
                              .add("generation", *generation)
                              .add("lost_node", node)
                              .add("policy", "replace")
                              .add("restarts_spent", d.restartCount));
          DDPRUN_LOG(WARN, "launcher") << cause << "; recovering in process (generation "
                                       << *generation << "): its rank(s) are taken by spares "
                                       << "of other nodes (" << taken << "), the workers of "
                                       << "every other node keep running (restart "
                                       << d.restartCount << " of " << options_.maxRestarts
                                       << " spent)";
        });
      });
}

void Agent::Impl::takeMovedRank(int g, int rank, int spareId, const std::string& cause) {
  // Its slot: after this node's own and any rank that moved here before (its progress record,
  // logs and LOCAL_RANK; LOCAL_WORLD_SIZE slot + 1 keeps its environment consistent).
  int slot = options_.nprocPerNode;
  for (const auto& w : group_->results()) {
    if (!w.spare && !w.sparesTemplate && w.localRank >= slot) slot = w.localRank + 1;
  }
  pid_t pid = -1;
  for (const auto& s : group_->waitingSpares()) {
    if (s.spareId == spareId) pid = s.pid;
  }
  if (pid <= 0 || !group_->assign(pid, slot, rank)) {
    // It died after node rank 0 read it ready: the rank has no process, so the group restarts
    // (the survivors' set-up of generation g would otherwise wait for it).
    WorkerResult gone;
    for (const auto& w : group_->results()) {
      if (w.spareId == spareId) gone = w;
    }
    gone.globalRank = rank;
    gone.localRank = slot;
    failAcross(gone, "spare " + std::to_string(spareId) + ", named by generation " +
                         std::to_string(g) + " to take rank " + std::to_string(rank) +
                         " of a lost node, is no longer waiting");
    return;
  }
  group_->setPrefix(pid, prefixFor(rank, slot));
  if (schedulingPolicy(pid) == SCHED_IDLE) {
    std::string idleError;
    leaveIdlePriority(pid, idleError);
  }
  const std::string table = progressTablePath();
  if (!table.empty()) {
    progressTable_->reset(slot, FreezePolicy::heartbeatPeriodMs(options_.peerTimeout));
  }
  if (startedGeneration_.size() <= static_cast<size_t>(slot)) {
    startedGeneration_.resize(static_cast<size_t>(slot) + 1, 0);
  }
  startedGeneration_[static_cast<size_t>(slot)] = g;
  const int epoch = linkEpoch_;
  storeLink().run(
      [key = keys::spareAssignKey(spareId),
       text = keys::formatSpareAssignment({.generation = g,
                                           .rank = rank,
                                           .localRank = slot,
                                           .localWorldSize = slot + 1})](rendezvous::Store& s) {
        s.set(key, text);
      },
      [this, epoch, rank, spareId](const std::string& error) {
        guarded([&] {
          if (epoch != linkEpoch_ || error.empty()) return;
          DDPRUN_LOG(ERROR, "launcher") << "spare " << spareId << " could not be told to take "
                                        << "rank " << rank << ": " << error;
        });
      });
  events::instant("spare assign", "agent",
                  events::Args()
                      .add("spare", spareId)
                      .add("pid", static_cast<int64_t>(pid))
                      .add("rank", rank)
                      .add("local_rank", slot)
                      .add("generation", g));
  DDPRUN_LOG(WARN, "launcher") << "generation " << g << ": spare " << spareId << " (pid " << pid
                               << ") of this node takes rank " << rank << " (local rank "
                               << slot << ") of a lost node (" << cause
                               << "); the workers of this node keep running";
  startSpare(/*idle=*/idleSpares_ == 1);  // in the background: the next failure's
  publishSpares();
  watchProgress();
}

}  // namespace ddprun::launcher
