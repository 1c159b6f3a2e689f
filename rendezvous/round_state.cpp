#include "rendezvous/round_state.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace ddprun::rendezvous {

const char* phaseName(Phase p) {
  switch (p) {
    case Phase::Joining: return "joining";
    case Phase::Closed: return "closed";
    case Phase::Finished: return "finished";
    case Phase::Failed: return "failed";
  }
  return "?";
}

const NodeInfo* RoundState::member(const std::string& id) const {
  for (const auto& m : members)
    if (m.id == id) return &m;
  return nullptr;
}

int RoundState::rankOf(const std::string& id) const {
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i].id == id) return static_cast<int>(i);
  return -1;
}

namespace {
bool contains(const std::vector<std::string>& v, const std::string& id) {
  return std::find(v.begin(), v.end(), id) != v.end();
}
}  // namespace

bool RoundState::knows(const std::string& id) const {
  auto has = [&](const std::vector<NodeInfo>& v) {
    return std::any_of(v.begin(), v.end(), [&](const NodeInfo& n) { return n.id == id; });
  };
  return has(members) || has(waiting) || has(expected);
}

std::vector<std::string> RoundState::allIds() const {
  std::set<std::string> ids;
  for (const auto* v : {&members, &waiting, &expected})
    for (const auto& n : *v) ids.insert(n.id);
  return {ids.begin(), ids.end()};
}

bool naturalLess(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) &&
        std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t i2 = i, j2 = j;
      while (i2 < a.size() && std::isdigit(static_cast<unsigned char>(a[i2]))) ++i2;
      while (j2 < b.size() && std::isdigit(static_cast<unsigned char>(b[j2]))) ++j2;
      // Compare the numbers without overflow: strip leading zeros, then length, then digits.
      std::string_view x(a.data() + i, i2 - i), y(b.data() + j, j2 - j);
      while (x.size() > 1 && x[0] == '0') x.remove_prefix(1);
      while (y.size() > 1 && y[0] == '0') y.remove_prefix(1);
      if (x.size() != y.size()) return x.size() < y.size();
      if (x != y) return x < y;
      i = i2;
      j = j2;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

// ---- Transitions ----
namespace transition {
namespace {

// Assigns node ranks and closes the round: fixed ranks first, then each node's previous
// rank when it still exists, then the rest in address order on the free ranks.
RoundState close(RoundState s) {
  const int n = static_cast<int>(s.members.size());
  std::vector<std::optional<NodeInfo>> byRank(n);
  std::vector<NodeInfo> rest;
  std::vector<NodeInfo> keep;
  for (const auto& m : s.members) {
    if (m.fixedRank >= 0 && m.fixedRank < n && !byRank[m.fixedRank]) byRank[m.fixedRank] = m;
    else keep.push_back(m);
  }
  std::sort(keep.begin(), keep.end(),
            [](const NodeInfo& a, const NodeInfo& b) { return a.prevRank < b.prevRank; });
  for (const auto& m : keep) {
    if (m.prevRank >= 0 && m.prevRank < n && !byRank[m.prevRank]) byRank[m.prevRank] = m;
    else rest.push_back(m);
  }
  std::sort(rest.begin(), rest.end(), [](const NodeInfo& a, const NodeInfo& b) {
    if (a.addr != b.addr) return naturalLess(a.addr, b.addr);
    return a.id < b.id;
  });
  size_t next = 0;
  for (auto& slot : byRank)
    if (!slot) slot = rest[next++];
  s.members.clear();
  for (auto& slot : byRank) {
    slot->prevRank = -1;
    s.members.push_back(*slot);
  }
  s.expected.clear();
  s.lost.clear();  // Joining: the nodes removed while it was open (see remove)
  s.phase = Phase::Closed;
  return s;
}

bool allExpectedBack(const RoundState& s) {
  if (s.expected.empty()) return false;  // the first round waits for MAX or its deadline
  return std::all_of(s.expected.begin(), s.expected.end(),
                     [&](const NodeInfo& e) { return s.member(e.id) != nullptr; });
}

RoundState maybeClose(RoundState s, const JobLimits& lim) {
  const int n = static_cast<int>(s.members.size());
  if (s.phase == Phase::Joining && (n >= lim.maxNodes || (n >= lim.minNodes && allExpectedBack(s))))
    return close(std::move(s));
  return s;
}

// Round r+1 of a closed round, awaiting every member (with its rank) and waiting node back,
// except `without`.
RoundState openNext(const RoundState& s, const std::string& without, std::string reason) {
  RoundState next;
  next.round = s.round + 1;
  next.phase = Phase::Joining;
  next.restarts = s.restarts;
  next.reason = std::move(reason);
  for (size_t r = 0; r < s.members.size(); ++r) {
    if (s.members[r].id == without || contains(s.lost, s.members[r].id)) continue;
    next.expected.push_back(NodeInfo{.id = s.members[r].id, .prevRank = static_cast<int>(r)});
  }
  for (const auto& w : s.waiting)
    if (w.id != without) next.expected.push_back(NodeInfo{.id = w.id, .prevRank = -1});
  return next;
}

std::string describe(const NodeInfo& n) { return "node " + n.id + " (" + n.addr + ")"; }

// A finishing round whose members are all done or lost is Finished.
RoundState finishIfAllDone(RoundState s) {
  for (const auto& m : s.members)
    if (!contains(s.done, m.id) && !contains(s.lost, m.id)) return s;
  s.phase = Phase::Finished;
  if (s.lost.empty()) {
    s.reason = "every node's workers succeeded in round " + std::to_string(s.round);
  } else {
    s.reason = "the workers of " + std::to_string(s.done.size()) + " node(s) succeeded in round " +
               std::to_string(s.round) + " and " + std::to_string(s.lost.size()) +
               " node(s) were lost in the exit barrier or, in process, before it (last: " +
               s.reason + ")";
  }
  return s;
}

void checkFixedRank(const std::vector<NodeInfo>& nodes, const NodeInfo& node,
                    const JobLimits& lim) {
  if (node.fixedRank < 0) return;
  if (node.fixedRank >= lim.maxNodes) {
    throw ConfigError("--node-rank=" + std::to_string(node.fixedRank) + " is out of range for " +
                      std::to_string(lim.maxNodes) + " nodes (allowed: 0.." +
                      std::to_string(lim.maxNodes - 1) + ")");
  }
  for (const auto& m : nodes) {
    if (m.fixedRank == node.fixedRank && m.id != node.id) {
      throw ConfigError("--node-rank=" + std::to_string(node.fixedRank) + " is already taken by " +
                        describe(m) + ": give every node a different --node-rank");
    }
  }
}

}  // namespace

std::optional<RoundState> join(const RoundState& s, const NodeInfo& node, const JobLimits& lim) {
  if (s.phase == Phase::Finished || s.phase == Phase::Failed) {
    const bool failed = s.phase == Phase::Failed;
    throw JobEndedError(std::string("the job has already ") + (failed ? "failed" : "finished") +
                            " (" + s.reason + "): use a new --rdzv-id for a new job",
                        failed, s.exitCode, s.reason);
  }
  if (s.member(node.id)) return std::nullopt;
  if (s.phase == Phase::Joining) {
    checkFixedRank(s.members, node, lim);
    RoundState next = s;
    NodeInfo n = node;
    n.prevRank = -1;
    for (const auto& e : s.expected)
      if (e.id == node.id) n.prevRank = e.prevRank;
    next.members.push_back(n);
    next.lost.erase(std::remove(next.lost.begin(), next.lost.end(), node.id), next.lost.end());
    return maybeClose(std::move(next), lim);
  }
  // Closed.
  for (const auto& w : s.waiting)
    if (w.id == node.id) return std::nullopt;
  if (static_cast<int>(s.members.size()) < lim.maxNodes && !s.finishing()) {
    checkFixedRank(s.members, node, lim);
    RoundState next = openNext(s, "", describe(node) + " arrived");
    NodeInfo n = node;
    n.prevRank = -1;
    next.members.push_back(n);
    return maybeClose(std::move(next), lim);
  }
  RoundState next = s;
  next.waiting.push_back(node);
  return next;
}

std::optional<RoundState> arrive(const RoundState& s, const NodeInfo& node, const JobLimits& lim) {
  DDPRUN_CHECK(s.phase != Phase::Joining, "arrive() on a joining round: take a slot instead");
  if (s.phase == Phase::Closed && !s.member(node.id) &&
      static_cast<int>(s.members.size()) < lim.maxNodes && !s.finishing() &&
      std::none_of(s.waiting.begin(), s.waiting.end(),
                   [&](const NodeInfo& w) { return w.id == node.id; })) {
    RoundState next = openNext(s, "", describe(node) + " arrived");
    next.expected.push_back(NodeInfo{.id = node.id, .prevRank = -1});
    return next;
  }
  return join(s, node, lim);  // the job ended (throws), a member already, or it waits
}

std::optional<RoundState> closeWithSlots(const RoundState& s, int64_t round,
                                         const std::vector<NodeInfo>& arrived,
                                         const JobLimits& lim, bool slotOrder) {
  if (s.phase != Phase::Joining || s.round != round || !s.members.empty()) return std::nullopt;
  RoundState next = s;
  // Hashed lookups: the closer runs this over every arrival of a round of up to MAX nodes, and
  // linear ones (member(), a scan of `expected`) made it O(N^2) -- 0.2 s at 10,000 nodes, on
  // the critical path of every re-form (perf, ddprun-bench rendezvous --simulate).
  const std::unordered_set<std::string> lost(s.lost.begin(), s.lost.end());
  std::unordered_map<std::string, int> prevRank;  // the last entry of an id wins, as before
  for (const auto& e : s.expected) prevRank[e.id] = e.prevRank;
  std::unordered_set<std::string> taken;
  for (const NodeInfo& a : arrived) {
    if (lost.count(a.id) || taken.count(a.id)) continue;  // removed, or a second slot
    if (static_cast<int>(next.members.size()) >= lim.maxNodes) break;
    NodeInfo n = a;
    n.fixedRank = -1;
    const auto p = prevRank.find(a.id);
    n.prevRank = p == prevRank.end() ? -1 : p->second;
    taken.insert(a.id);
    next.members.push_back(n);
  }
  if (static_cast<int>(next.members.size()) >= lim.minNodes) {
    if (!slotOrder) return close(std::move(next));
    for (auto& m : next.members) m.prevRank = -1;  // node rank = position in slot order
    next.expected.clear();
    next.lost.clear();
    next.phase = Phase::Closed;
    return next;
  }
  // Departures while it was open left it below MIN: the next round awaits the rest.
  RoundState again;
  again.round = s.round + 1;
  again.restarts = s.restarts;
  again.reason = "round " + std::to_string(s.round) + " had fewer than MIN=" +
                 std::to_string(lim.minNodes) + " nodes when it closed (" + s.reason + ")";
  again.expected = s.expected;
  for (const NodeInfo& m : next.members)
    if (!prevRank.count(m.id)) again.expected.push_back(NodeInfo{.id = m.id, .prevRank = -1});
  return again;
}

std::optional<RoundState> closeWithSlotList(const RoundState& s, int64_t round,
                                            const ListRef& members, int64_t world,
                                            const std::string& masterAddr, uint16_t masterPort) {
  if (s.phase != Phase::Joining || s.round != round || !s.members.empty()) return std::nullopt;
  RoundState next = s;
  next.phase = Phase::Closed;
  next.expected.clear();
  next.expectedList = {};
  next.lost.clear();
  next.membersList = members;
  next.worldSize = world;
  next.masterAddr = masterAddr;
  next.masterPort = masterPort;
  return next;
}

std::optional<RoundState> closeAtDeadline(const RoundState& s, int64_t round,
                                          const JobLimits& lim) {
  if (s.phase != Phase::Joining || s.round != round ||
      static_cast<int>(s.members.size()) < lim.minNodes) {
    return std::nullopt;
  }
  return close(s);
}

std::optional<RoundState> remove(const RoundState& s, const std::string& id,
                                 const std::string& reason, const JobLimits& lim) {
  auto erase = [&](std::vector<NodeInfo>& v) {
    auto it = std::remove_if(v.begin(), v.end(), [&](const NodeInfo& n) { return n.id == id; });
    bool found = it != v.end();
    v.erase(it, v.end());
    return found;
  };
  if (s.phase == Phase::Joining) {
    // Remembered until the round closes: a slot join's record of this node must not make it a
    // member (closeWithSlots), whether or not the state knew the node.
    RoundState next = s;
    bool a = erase(next.members), b = erase(next.expected), c = erase(next.waiting);
    if (!contains(next.lost, id)) next.lost.push_back(id);
    else if (!(a || b || c)) return std::nullopt;
    return maybeClose(std::move(next), lim);
  }
  if (s.phase != Phase::Closed) return std::nullopt;
  if (s.member(id) && s.finishing()) {
    if (contains(s.done, id) || contains(s.lost, id)) return std::nullopt;
    RoundState next = s;
    next.lost.push_back(id);
    next.reason = reason;
    return finishIfAllDone(std::move(next));
  }
  if (s.member(id) && lim.keepRoundOnNodeLoss && s.rankOf(id) > 0) {
    // Lost in process: the others keep running; node rank 0's agent decides (its watcher reads
    // every version of the round) and spends the restart, or re-forms (reformWithoutLost).
    if (contains(s.lost, id)) return std::nullopt;
    RoundState next = s;
    next.lost.push_back(id);
    next.reason = reason + " (lost in process)";
    return next;
  }
  if (s.member(id)) return openNext(s, id, reason);
  RoundState next = s;
  if (!erase(next.waiting)) return std::nullopt;
  return next;
}

std::optional<RoundState> failWorkers(const RoundState& s, int64_t round, const std::string& id,
                                      int exitCode, const std::string& reason,
                                      const JobLimits& lim, bool final) {
  if (s.phase != Phase::Closed || s.round != round || !s.member(id)) return std::nullopt;
  if (final) {
    RoundState next = s;
    next.phase = Phase::Failed;
    next.exitCode = exitCode;
    next.reason = reason + " (not retryable: no restart spent)";
    return next;
  }
  if (s.restarts < lim.maxRestarts) {
    RoundState next = openNext(s, "", reason + " (restart " + std::to_string(s.restarts + 1) +
                                          " of " + std::to_string(lim.maxRestarts) + ")");
    next.restarts = s.restarts + 1;
    return next;
  }
  RoundState next = s;
  next.phase = Phase::Failed;
  next.exitCode = exitCode;
  next.reason = reason + " and no restart is left (max_restarts=" +
                std::to_string(lim.maxRestarts) + ")";
  return next;
}

std::optional<RoundState> failRecoveredWorkers(const RoundState& s, int64_t round,
                                               const std::string& id, const std::string& reason,
                                               const JobLimits& lim) {
  if (s.phase != Phase::Closed || s.round != round || !s.member(id)) return std::nullopt;
  return openNext(s, "", failedRecoveryReason(reason, s.restarts, lim));  // restarts kept
}

std::string failedRecoveryReason(const std::string& reason, int restarts,
                                 const JobLimits& lim) {
  return reason + " (after its in-process recovery, which spent restart " +
         std::to_string(restarts) + " of " + std::to_string(lim.maxRestarts) +
         ": no second restart spent)";
}

std::optional<RoundState> recoverWorkers(const RoundState& s, int64_t round, const std::string& id,
                                         int exitCode, const std::string& reason,
                                         const JobLimits& lim, bool final) {
  if (s.phase != Phase::Closed || s.round != round || !s.member(id)) return std::nullopt;
  if (final || s.restarts >= lim.maxRestarts) return failWorkers(s, round, id, exitCode, reason, lim, final);
  RoundState next = s;
  next.restarts = s.restarts + 1;
  next.reason = recoveredReason(reason, next.restarts, lim);
  return next;
}

std::string recoveredReason(const std::string& reason, int restart, const JobLimits& lim) {
  // The reason names the node: two agents recovering at once from the same version must not
  // write the same bytes (the log's compare-set would let both believe they won, spending one
  // restart for two recoveries).
  return reason + " (recovered in process: restart " + std::to_string(restart) + " of " +
         std::to_string(lim.maxRestarts) + ")";
}

std::optional<RoundState> reformWithoutLost(const RoundState& s, int64_t round,
                                            const std::string& reason) {
  if (s.phase != Phase::Closed || s.round != round || s.lost.empty() || s.finishing())
    return std::nullopt;
  return openNext(s, "", reason);  // openNext leaves the lost members out
}

std::optional<RoundState> nodeDone(const RoundState& s, int64_t round, const std::string& id) {
  if (s.phase != Phase::Closed || s.round != round || !s.member(id) || contains(s.done, id)) {
    return std::nullopt;
  }
  RoundState next = s;
  next.lost.erase(std::remove(next.lost.begin(), next.lost.end(), id), next.lost.end());
  next.done.push_back(id);
  return finishIfAllDone(std::move(next));
}

std::optional<RoundState> finishWithDone(const RoundState& s, int64_t round,
                                         const std::vector<std::string>& doneIds) {
  if (s.phase != Phase::Closed || s.round != round) return std::nullopt;
  RoundState next = s;
  for (const auto& id : doneIds)
    if (s.member(id) && !contains(next.done, id)) next.done.push_back(id);
  next.lost.erase(std::remove_if(next.lost.begin(), next.lost.end(),
                                 [&](const std::string& id) { return contains(next.done, id); }),
                  next.lost.end());
  next = finishIfAllDone(std::move(next));
  if (next.phase != Phase::Finished) return std::nullopt;
  return next;
}

std::optional<RoundState> finish(const RoundState& s, int64_t round) {
  if (s.phase != Phase::Closed || s.round != round) return std::nullopt;
  RoundState next = s;
  next.phase = Phase::Finished;
  next.reason = "every node's workers succeeded in round " + std::to_string(round);
  return next;
}

}  // namespace transition

int slotTarget(const RoundState& s, const JobLimits& lim) {
  const int64_t expected = s.expectedCount();
  if (expected == 0) return lim.maxNodes;
  return static_cast<int>(std::clamp<int64_t>(expected, lim.minNodes, lim.maxNodes));
}

std::string lastCallKey(int64_t round) { return "round/" + std::to_string(round) + "/last_call"; }
std::string closedKey(int64_t round) { return "round/" + std::to_string(round) + "/closed"; }
std::string overKey(int64_t round) { return "round/" + std::to_string(round) + "/over"; }

std::vector<std::string> markersFor(const RoundState& s, const JobLimits& lim) {
  std::vector<std::string> keys;
  if (s.round > 0) keys.push_back(overKey(s.round - 1));
  if (s.phase != Phase::Joining || static_cast<int>(s.members.size()) >= lim.minNodes)
    keys.push_back(lastCallKey(s.round));
  if (s.phase != Phase::Joining) keys.push_back(closedKey(s.round));
  if (s.phase == Phase::Finished || s.phase == Phase::Failed) keys.push_back(overKey(s.round));
  return keys;
}

}  // namespace ddprun::rendezvous
