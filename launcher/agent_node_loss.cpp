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
                                    if (e) std::rethrow_exception(e);
                                    if (epoch != linkEpoch_ || state_ != State::Running) return;
                                    onHandlerDecision(d);
                                  });
                                });
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
  } else if (options_.recoveryPolicy != LaunchOptions::RecoveryPolicy::Shrink) {
    why = "--recovery-policy=replace takes a lost node's ranks only with spares on other nodes, "
          "which is not implemented (use --recovery-policy=shrink)";
  } else if (worldNow_ - nodeCounts_[static_cast<size_t>(k)] < options_.shrinkMinRanks) {
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
  int first = 0;
  for (int n = 0; n < k; ++n) first += nodeCounts_[static_cast<size_t>(n)];
  const int count = nodeCounts_[static_cast<size_t>(k)];
  const int world = worldNow_;
  auto missing = std::make_shared<std::string>();
  const int epoch = linkEpoch_;
  const std::string cause = "node rank " + std::to_string(k) + " was lost: " + d.reason;
  storeLink_->run(
      [missing, first, count, world](rendezvous::Store& s) {
        for (int rank = 0; rank < world; ++rank) {
          if (rank >= first && rank < first + count) continue;
          if (!s.check({keys::announceKey(rank)})) {
            *missing = "rank " + std::to_string(rank) + " does not hold the training state yet";
            return;
          }
        }
      },
      [this, k, what, cause, missing, epoch](const std::string& error) {
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
              [this, k, cause, epoch](std::exception_ptr e, JobDecision dec) {
                guarded([&] {
                  if (e) std::rethrow_exception(e);
                  if (epoch != linkEpoch_ || state_ != State::Running) return;
                  if (!dec.recovered) {
                    nodeLossPending_ = false;
                    onHandlerDecision(dec);  // the round ended meanwhile, or no restart is left
                    return;
                  }
                  shrinkLostNode(k, cause, dec);
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
          if (epoch != linkEpoch_ || state_ != State::Running) return;
          nodeLossPending_ = false;
          if (!error.empty()) {
            // The restart stays spent; the round must end for every node.
            reformWithoutNode("node rank " + std::to_string(node) + " was lost",
                              "its generation could not be published (" + error + ")",
                              /*spent=*/true);
            return;
          }
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

}  // namespace ddprun::launcher
