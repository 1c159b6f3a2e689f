#pragma once
// RoundState: the state of one multi-node job's rendezvous, and the pure transitions on it.
//
// The job's history is a log of states kept in the store (see state_log.h); every agent
// changes it only by computing `next = transition(current)` and appending `next` with a
// compare-set, so every transition here is a pure function of the state it is applied to:
// no clocks, no I/O. Each returns the new state, or nullopt when it does not apply (nothing
// to write). docs/rendezvous.md draws the state diagram.
//
//   Joining(r) --join reaches MAX, or MIN reached and every expected node is back,
//               or the last-call deadline passes with >= MIN--> Closed(r)
//   Closed(r)  --a node arrives (room left), a member leaves or is evicted,
//               or workers fail (restart budget left)--> Joining(r+1)
//   Closed(r)  --workers fail, no restart left, or an error retrying cannot fix--> Failed
//   Closed(r)  --a node's workers succeeded--> Closed(r), finishing: from then on nobody re-forms
//               the job; --every member done (or lost in the exit barrier)--> Finished
// Finished and Failed are final: no transition leaves them, so once the job has ended no
// eviction, arrival or late heartbeat starts another round anywhere.
//
// In Closed(r) `members` is ordered by node rank. Node ranks are stable: a node of round r
// keeps its rank in round r+1 when that rank still exists; newcomers fill the free ranks in
// address order.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/errors.h"

namespace ddprun::rendezvous {

// The job this node tried to join has already finished or failed: there is nothing to join.
class JobEndedError : public Error {
 public:
  JobEndedError(const std::string& what, bool failed, int exitCode, std::string reason = {})
      : Error(what), failed_(failed), exitCode_(exitCode), reason_(std::move(reason)) {}
  bool failed() const { return failed_; }
  int exitCode() const { return exitCode_; }  // the root cause's, when failed()
  const std::string& reason() const { return reason_; }  // the final state's reason

 private:
  bool failed_;
  int exitCode_;
  std::string reason_;
};

// One agent (node) as the rendezvous sees it.
struct NodeInfo {
  std::string id;           // unique per agent process; no whitespace
  std::string addr;         // the address it advertises (MASTER_ADDR when it has rank 0)
  int nproc = 1;            // workers on this node
  uint16_t masterPort = 0;  // a port free on `addr`, used as MASTER_PORT when it has rank 0
  int fixedRank = -1;       // static backend: --node-rank; -1 for dynamic nodes
  int prevRank = -1;        // Joining only: its rank in the round before (-1: none)
  bool operator==(const NodeInfo&) const = default;
};

enum class Phase : uint8_t { Joining, Closed, Finished, Failed };
const char* phaseName(Phase p);

// A list of nodes kept outside the state version (the slot join's compact states, StateLog's
// "spilled" lists: docs/rendezvous.md, "Keys"): the version names it by `ref` (keys l/<ref>/...)
// and carries its length, so that an agent reads O(1) bytes per version. ref 0: no such list.
// Refs from kJoinerListBase on are lists written by their own joiners (arrival ranks:
// scalable::slotListRef): a joiner whose slot came after the round's count wrote its id key
// there too, so an id key beyond the count names a node that is not in the list.
inline constexpr int64_t kJoinerListBase = 1'000'000'000;  // above any ref of the `lists` counter
// The waiting list of a full closed round r (issue 20): each node arriving there takes an index
// of r/<r>/waiting and writes its own entry of list kWaitingListBase + r (write-once), instead
// of a writer loading and rewriting the whole list in a version. Above the joiners' lists of
// any round (rounds stay below 10^9).
inline constexpr int64_t kWaitingListBase = 2'000'000'000;
inline int64_t waitingListRef(int64_t round) { return kWaitingListBase + round; }
struct ListRef {
  int64_t ref = 0;
  int64_t count = 0;
  // The list of nodes expected back only: it is the member list `ref` of the round before, each
  // entry expected with its node rank (a restart after a failure writes no new list).
  bool ofMembers = false;
  // ofMembers only: every member but this one (a member removed from a closed round: the
  // eviction or departure writes no list, StateLog's removeNode). `count` is then the member
  // list's length minus one.
  std::string without;
  // ofMembers only: every member and this node after them, a newcomer (prevRank -1): an
  // arrival into a running round with room writes no list. `count` is then the member list's
  // length plus one. At most one of `without` and `with`.
  std::string with;
  // ofMembers only: and after them the first `waiting` nodes of the round before's waiting list
  // (a full round's arrivals, each registered by itself on counters with its own entry of list
  // waitingListRef(round - 1): scalable::joinWaitingList), newcomers (prevRank -1): a re-form
  // with a waiting list loads and writes no list either. `count` includes them.
  int64_t waiting = 0;
  // The entries of the list `ref` names (count, plus the one left out by `without`, less the
  // one `with` adds and the waiting nodes).
  int64_t stored() const {
    return count + (without.empty() ? 0 : 1) - (with.empty() ? 0 : 1) - waiting;
  }
  bool operator==(const ListRef&) const = default;
};

struct RoundState {
  int64_t round = 0;
  Phase phase = Phase::Joining;
  int restarts = 0;               // restarts spent by the whole job (counted once per job)
  std::vector<NodeInfo> members;  // Joining: join order; Closed/Finished/Failed: rank order
  std::vector<NodeInfo> waiting;  // Closed: arrivals while the round was full
  std::vector<NodeInfo> expected; // Joining: nodes of the round before, awaited back (id, prevRank)
  std::vector<std::string> done;  // Closed: members whose workers succeeded (in the exit barrier)
  std::vector<std::string> lost;  // Closed, finishing: members that left or were evicted since;
                                  // Closed, not finishing: members lost in process
                                  // (JobLimits::keepRoundOnNodeLoss);
                                  // Joining: nodes removed while it was open
  // Finished with spilled lists (StateLog::spill): every member not in `lost` is done, and
  // `done` is left out of the version ("done-all"), so that every agent reads O(1) bytes at the
  // job's end instead of every done id; StateLog::hydrate fills `done` from the members.
  bool allDone = false;
  int exitCode = 0;               // Failed: the root cause's exit code
  std::string reason;             // why this round was opened / the job ended (one line)
  // A compact state (read from a version written with spilled lists): `members` or `expected`
  // is then empty and kept in the store instead (StateLog::hydrate loads it). With membersList:
  // the round's world size and node rank 0's address and port, so that a member needs only its
  // own entry (StateLog::position) besides this.
  ListRef membersList, waitingList, expectedList;
  int64_t worldSize = 0;
  std::string masterAddr;
  uint16_t masterPort = 0;

  bool compact() const {
    return membersList.ref != 0 || waitingList.ref != 0 || expectedList.ref != 0;
  }
  int64_t memberCount() const {
    return membersList.ref ? membersList.count : static_cast<int64_t>(members.size());
  }
  // The three lists of nodes by kind, and the refs that stand for them in a compact state.
  enum class List { Members, Waiting, Expected };
  std::vector<NodeInfo>& list(List l) {
    return l == List::Members ? members : l == List::Waiting ? waiting : expected;
  }
  const std::vector<NodeInfo>& list(List l) const { return const_cast<RoundState*>(this)->list(l); }
  ListRef& listRef(List l) {
    return l == List::Members ? membersList : l == List::Waiting ? waitingList : expectedList;
  }
  const ListRef& listRef(List l) const { return const_cast<RoundState*>(this)->listRef(l); }
  int64_t expectedCount() const {
    return expectedList.ref ? expectedList.count : static_cast<int64_t>(expected.size());
  }

  // Some node's workers have succeeded: the round will not be re-formed.
  bool finishing() const { return !done.empty() || allDone; }

  const NodeInfo* member(const std::string& id) const;
  int rankOf(const std::string& id) const;  // -1 when not a member
  bool knows(const std::string& id) const;  // member, waiting or expected
  bool ended() const { return phase == Phase::Finished || phase == Phase::Failed; }
  // Every node id the state mentions, sorted (the heartbeat ring).
  std::vector<std::string> allIds() const;
  bool operator==(const RoundState&) const = default;
};

// Membership bounds of the job (--nnodes MIN:MAX) and its restart budget (--max-restarts).
struct JobLimits {
  int minNodes = 1;
  int maxNodes = 1;
  int maxRestarts = 0;
  // A member other than node rank 0 that is evicted (or leaves) while its closed round runs is
  // *lost in process* instead of re-forming the job: it is listed in `lost` and the round goes
  // on, so that node rank 0's agent can keep the other nodes' workers running (in-process
  // recovery, docs/recovery.md#a-lost-node). That agent then spends a restart and keeps the
  // round (recoverWorkers) or re-forms it without the node (reformWithoutLost). Set by agents
  // that recover in process with the agent store; node rank 0's own loss re-forms as before
  // (the workers' store is gone with it).
  bool keepRoundOnNodeLoss = false;
};

// Text encoding, one record per line; decode throws StoreError naming `what` on bad input:
// every field is checked (ids, addresses, nproc in 1..kMaxNproc, ranks >= -1, ports).
inline constexpr int kMaxNproc = 1 << 16;
std::string encodeState(const RoundState& s);
RoundState decodeState(const std::string& text, const std::string& what);
// Checks a decoded state against the job's limits: at most MAX members, no member twice, node
// ranks below MAX, restarts within the budget, the world size within MAX x kMaxNproc (so it
// cannot overflow), a closed round with members. Throws StoreError naming `what`: the state
// is corrupt or forged (without a token, anyone who reaches the store can write one).
void validateState(const RoundState& s, const JobLimits& lim, const std::string& what);
// One entry of a spilled list, as the state encodes it ("member ..." / "expected ..."), and
// the parse of such entries back (decodeState's checks; StoreError naming `what`).
std::string encodeNodeLine(const NodeInfo& n, RoundState::List list);
std::vector<NodeInfo> decodeNodeLines(const std::vector<std::string>& lines, RoundState::List list,
                                      const std::string& what);

namespace transition {

// `node` asks to take part. Joining: it becomes a member (closing the round when it reaches
// MAX, or MIN with every expected node back). Closed with room: it opens round r+1 with the
// members expected back. Closed and full, or finishing: it waits (finished work is never redone
// because a node came late). Throws ConfigError when its fixed rank is
// out of range or already taken, and JobEndedError when the job has finished or failed.
std::optional<RoundState> join(const RoundState& s, const NodeInfo& node, const JobLimits& lim);

// ---- Forming a round by the slot join (the ddprun store's dynamic backend) ----
// Joiners do not append themselves to the log: each takes a slot of round r with one ADD and
// writes its own record (rendezvous/scalable/slot_join.h); a Joining(r) state has no members,
// its `expected` fixes the slot that closes it (slotTarget), and one agent -- the holder of that
// slot, or a member whose last call ran out -- appends Closed(r) with closeWithSlots.

// `node` arrives at a closed round: with room (and not finishing) it opens round r+1 awaiting
// the members, the waiting nodes and `node` itself; otherwise as join() (it waits, or the job
// has ended). Not for a joining round: there a node takes a slot.
std::optional<RoundState> arrive(const RoundState& s, const NodeInfo& node, const JobLimits& lim);

// Round `round` closes with the nodes whose slot records the closer read (`arrived`, in slot
// order): the ones removed while it was open (`lost`) and second slots of one node are left
// out, ranks are assigned as close() does (kept from the round before, newcomers in address
// order). Fewer than MIN left (departures while it was open): round r+1 opens instead, awaiting
// them. No-op when round `round` is not the joining round.
// With `slotOrder` (DynamicRendezvousOptions::arrivalRanks) node ranks follow slot order
// instead of being kept from the round before.
std::optional<RoundState> closeWithSlots(const RoundState& s, int64_t round,
                                         const std::vector<NodeInfo>& arrived,
                                         const JobLimits& lim, bool slotOrder = false);

// Arrival ranks (scalable/slot_join.h, "the slots are the member list"): round `round` closes
// with its slots 1..members.count as members, in slot order, the list being the one the joiners
// wrote themselves (`members`, world size `world`, node rank 0's address and port). A compact
// state in, a compact state out: O(1). No-op when round `round` is not the joining round.
std::optional<RoundState> closeWithSlotList(const RoundState& s, int64_t round,
                                            const ListRef& members, int64_t world,
                                            const std::string& masterAddr, uint16_t masterPort);

// The last-call deadline of round `round` passed: close it when it has at least MIN members.
std::optional<RoundState> closeAtDeadline(const RoundState& s, int64_t round, const JobLimits& lim);

// Node `id` left (SIGTERM) or was evicted (no heartbeat). A member of a closed round opens
// round r+1 without it; in a joining round it is dropped (which may close the round) and kept
// in `lost` until the round closes, so that a slot it took does not make it a member. In a
// finishing round a member that is not done is *lost* instead: the job is not re-formed (a node's
// workers succeed only once the whole group is through its collectives), and it is Finished once
// every member is done or lost. A done member leaving changes nothing. With
// JobLimits::keepRoundOnNodeLoss a member of a closed round other than node rank 0 is listed in
// `lost` and the round goes on (no restart spent here: node rank 0's agent decides); a member
// already lost changes nothing.
std::optional<RoundState> remove(const RoundState& s, const std::string& id,
                                 const std::string& reason, const JobLimits& lim);

// Workers of node `id` failed in round `round`: spend one restart of the job-wide budget and
// open round r+1, or end the job as Failed when none is left -- or at once when `final` (an error
// that retrying cannot fix: a bad config, an incompatible checkpoint, missing data). No-op when
// round `round` is over. Lost members are not expected back.
std::optional<RoundState> failWorkers(const RoundState& s, int64_t round, const std::string& id,
                                      int exitCode, const std::string& reason,
                                      const JobLimits& lim, bool final = false);

// The in-process recovery node `id`'s agent made in round `round` (recoverWorkers spent its
// restart) failed after all -- the spare that was to take the rank died, the generation could
// not be published -- so the group restarts: open round r+1 without spending a second restart
// (one failure costs the budget one restart, as on one node). No-op when round `round` is over.
std::optional<RoundState> failRecoveredWorkers(const RoundState& s, int64_t round,
                                               const std::string& id, const std::string& reason,
                                               const JobLimits& lim);
// The reason failRecoveredWorkers writes (the job's `restarts` so far, none spent by it).
std::string failedRecoveryReason(const std::string& reason, int restarts,
                                 const JobLimits& lim);

// A worker of node `id` died in round `round` and its agent recovers in process (docs/recovery.md:
// the others keep running): spend one restart of the job-wide budget and keep the round (no
// round r+1, so no other node restarts), or end the job as Failed when none is left, or at once
// when `final`. No-op when round `round` is over (the agents restart as for any new round).
std::optional<RoundState> recoverWorkers(const RoundState& s, int64_t round, const std::string& id,
                                         int exitCode, const std::string& reason,
                                         const JobLimits& lim, bool final = false);
// The reason recoverWorkers writes for the job's `restart`th restart.
std::string recoveredReason(const std::string& reason, int restart, const JobLimits& lim);

// Round `round` has members lost in process (remove with keepRoundOnNodeLoss) and node rank 0's
// agent cannot recover them in process: round r+1 opens awaiting the others, as an eviction
// always did, spending no restart. No-op when round `round` is over or lost no member.
std::optional<RoundState> reformWithoutLost(const RoundState& s, int64_t round,
                                            const std::string& reason);

// Node `id`'s workers succeeded in round `round`: it is done. The first done node makes the round
// finishing: from then on arrivals wait instead of opening a new round, and departures are lost
// (see remove). Once every member is done or lost the job is Finished. No-op when already done or
// when round `round` is over.
std::optional<RoundState> nodeDone(const RoundState& s, int64_t round, const std::string& id);

// The slot join's exit barrier: `doneIds` are the members whose workers succeeded in round
// `round`, as counted outside the log (r/<r>/done). Finished when with them every member is
// done or lost (a done node counted as lost too is done); otherwise nullopt (nothing written).
std::optional<RoundState> finishWithDone(const RoundState& s, int64_t round,
                                         const std::vector<std::string>& doneIds);

// Every node's workers succeeded in round `round`: the job is Finished.
std::optional<RoundState> finish(const RoundState& s, int64_t round);

}  // namespace transition

// The slot whose holder closes a joining round at once: as many as are expected back
// (within MIN..MAX), or MAX when none is (the first round).
int slotTarget(const RoundState& s, const JobLimits& lim);

// Marker keys: write-once wake-up keys derived from a state, so that waiters WAIT on one key
// instead of following every version. Each maps to the version that implies it.
//   round/<r>/last_call  round r has >= MIN members (its last-call deadline is running)
//   round/<r>/closed     round r closed
//   round/<r>/over       round r ended: a new round opened, or the job finished or failed
std::string lastCallKey(int64_t round);
std::string closedKey(int64_t round);
std::string overKey(int64_t round);
std::vector<std::string> markersFor(const RoundState& s, const JobLimits& lim);

// Compares strings with runs of digits compared as numbers ("127.0.0.9" < "127.0.0.10").
bool naturalLess(const std::string& a, const std::string& b);

}  // namespace ddprun::rendezvous
