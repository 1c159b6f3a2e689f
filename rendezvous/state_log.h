#pragma once
// StateLog: a job's rendezvous state kept in the store as an append-only log of versions.
//
// Version v is the key `state/<v>` (v = 1, 2, ...; version 0 is the implicit empty round 0).
// Each version is written once, by COMPARE_SET against the missing key, so concurrent writers
// are ordered by the store: exactly one wins version v+1, and every loser gets the winner's
// state back in the same round trip and retries its transition on top of it. After a win, the
// writer sets, in one MULTI_SET, the marker keys the new state implies (markersFor in
// round_state.h) and the hint `latest` = v+1; on etcd in the txn that writes the version
// (Store::compareSetAndSet: one request). Waiters WAIT on one marker key (or on the next
// version's key); nobody sleeps and polls.
//
// Every version read is decoded and validated against the job's limits, and a version named by
// `latest` or a marker must exist: a corrupt or forged state throws StoreError in one line
// naming the key, so the agent fails the round at once instead of waiting on it. The store
// keeps written versions write-once (KeyTable::writeOnce): nobody deletes or rewrites one.
//
// Spilled lists (the slot join, issue 20): with `spill`, a version does not carry the round's
// member list, its waiting list nor the list of nodes expected back: the writer stores each list once, before the
// version, as write-once keys l/<ref>/<i> (entry i, encodeNodeLine) and l/<ref>/id/<id> ("<i>
// <first global rank>"), ref from an ADD on `lists`, and the version names it with its length
// (and the world size and node rank 0's address). A version is then O(1) bytes, and an agent
// reads its own entry (position(): one round trip). A list that a transition leaves unchanged
// keeps its ref. Writers (update) load the lists first (hydrate: O(N) for that one agent) since
// the transitions are pure functions of the whole state.
//
// A StateLog uses the one Store it is given; give each thread its own connection.
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>

#include "rendezvous/round_state.h"
#include "rendezvous/store.h"

namespace ddprun::rendezvous {

struct Versioned {
  int64_t version = 0;
  RoundState state;
};

std::string stateKey(int64_t version);
inline constexpr const char* kLatestKey = "latest";
// A spilled list's keys: entry i (encodeNodeLine) and, by id, "<i> <first global rank>".
std::string listKey(int64_t ref, int64_t i);
std::string listIdKey(int64_t ref, const std::string& id);
// A key's value without waiting for it (one compare-set that reads and never writes); nullopt
// when it is missing.
std::optional<std::string> tryGetKey(Store& store, const std::string& key);

class StateLog {
 public:
  using Transition = std::function<std::optional<RoundState>(const RoundState&)>;

  StateLog(Store& store, JobLimits limits, bool spill = false)
      : store_(store), limits_(limits), spill_(spill) {}

  // Loads the lists a compact state names into it (members, expected), checks them against the
  // version's counts and the job's limits (StoreError naming the key when forged). O(N).
  void hydrate(RoundState& s);

  // A recent version: the one the hint names (possibly a few versions behind).
  Versioned latest();
  Versioned read(int64_t version);
  // The newest version at the time of the call, starting from `known`.
  Versioned refresh(Versioned known);

  struct Result {
    Versioned now;      // the state that holds after the call
    bool wrote = false;  // whether `fn`'s result was appended
  };
  // Applies `fn` to the newest state and appends its result; on a lost race retries on the
  // winner's state. When `fn` returns nullopt on the newest state, nothing is written.
  Result update(Versioned known, const Transition& fn);
  // The same for a transition that works on compact states (its lists left in the store):
  // nothing is loaded nor spilled, so the writer's store work does not grow with N. `fn` gets
  // the state as read (compact, or loaded when `known` was) and returns one that names its
  // lists (its own lists, `members`/`expected`/`waiting`, empty). transition::closeWithSlotList.
  Result updateCompact(Versioned known, const Transition& fn);

  // Waits up to `timeout` for marker (or any) `key`; returns the version its value names.
  std::optional<int64_t> waitMarker(const std::string& key, Millis timeout);
  // The same, and reads that version: two round trips on ddprun-store (WAIT_GET, and a read
  // that fails naming `key` when the version was never written).
  std::optional<Versioned> waitMarkerRead(const std::string& key, Millis timeout);
  // Waits up to `timeout` for a version newer than `known`; returns it (one round trip on
  // ddprun-store: WAIT_GET).
  std::optional<Versioned> waitNewer(const Versioned& known, Millis timeout);

  Store& store() { return store_; }
  const JobLimits& limits() const { return limits_; }
  bool spills() const { return spill_; }

 private:
  // The compare-set of version `version` and, when it wins, its markers (markersFor(s)) and the
  // hint `latest`.
  std::string append(int64_t version, const std::string& blob, const RoundState& s);
  // decodeState + validateState: a corrupt or forged version throws StoreError naming `key`.
  RoundState decode(const std::string& text, const std::string& key) const;
  int64_t existing(int64_t version, const std::string& namedBy);
  // Version `version` if it was written, in one round trip (a compare-set that reads and never
  // writes, as position() reads a list entry); nullopt when it was not.
  std::optional<Versioned> tryRead(int64_t version);
  // The version a hint names, read (StoreError naming the hint when it was never written).
  Versioned readNamed(int64_t version, const std::string& namedBy);

  // Writes next's lists as spilled lists (reusing `before`'s refs when a list is unchanged).
  void spill(RoundState& next, const RoundState& beforeFull, const RoundState& beforeCompact);

  Store& store_;
  JobLimits limits_;
  bool spill_ = false;
};

// transition::remove(id) appended to the log. With spilled lists, the removal of a member from a
// closed round that is not finishing nor has a waiting list or members lost in process -- an
// eviction, a departure -- is written as an O(1) delta: round r+1 awaits "the member list of
// round r without `id`" (ListRef::without), or `id` joins the round's lost members (lost in
// process): the writer loads and writes no list. Anything else goes through update().
StateLog::Result removeNode(StateLog& log, const Versioned& known, const std::string& id,
                            const std::string& reason);

// transition::arrive (`node` arrives at a closed round) appended to the log, nothing on a
// joining round; with spilled lists, into a running round with room and without a waiting list
// or lost members, as an O(1) delta (round r+1 awaits the member list and the newcomer,
// ListRef::with): the writer loads no list.
StateLog::Result arriveNode(StateLog& log, const Versioned& known, const NodeInfo& node);

// transition::failWorkers appended to the log; with spilled lists and a closed round without
// a waiting list or lost members, as an O(1) delta (round r+1 awaits the member list, or the
// job fails naming the same lists): the writer loads no list.
StateLog::Result failNode(StateLog& log, const Versioned& known, int64_t round,
                          const std::string& id, int exitCode, const std::string& reason,
                          bool final);

// transition::failRecoveredWorkers appended to the log, as failNode (no restart spent).
StateLog::Result failRecoveredNode(StateLog& log, const Versioned& known, int64_t round,
                                   const std::string& id, const std::string& reason);

// transition::recoverWorkers appended to the log; with spilled lists and a closed round, as an
// O(1) delta (one more restart, the round and its lists kept), after one read of the member's
// own entry: the writer loads no list. A report about a round that is over writes nothing and
// loads no list either (so does failNode's).
StateLog::Result recoverNode(StateLog& log, const Versioned& known, int64_t round,
                             const std::string& id, int exitCode, const std::string& reason,
                             bool final);

// The slot join's exit barrier (DynamicRendezvous::finishBySlots). markFinishing: the first
// node done in closed round `round` appends transition::nodeDone; with spilled lists as an O(1)
// delta (the round's `done` line), after one read of its own entry. finishFromCount: a node
// that counted `doneCount` done nodes (r/<r>/done) appends Finished when every member is done
// or lost; with spilled lists and no member lost, `doneCount` >= the member count says so (each
// member counts itself once) and Finished is written as "done-all" (RoundState::allDone) without
// reading a done id or a list; with a lost member, `doneIds` (every done node's id, O(N) reads)
// tells the done from the lost (transition::finishWithDone).
StateLog::Result markFinishing(StateLog& log, const Versioned& known, int64_t round,
                               const std::string& id);
StateLog::Result finishFromCount(StateLog& log, const Versioned& known, int64_t round,
                                 int64_t doneCount,
                                 const std::function<std::vector<std::string>()>& doneIds);

// Where node `id` is in one of a state's lists (members, the waiting list, the nodes expected
// back): its index (the node rank, for members) and first global rank (the sum of nproc before). On a compact state one round trip
// (a compare-set that reads and never writes), on a loaded one a scan. nullopt when absent.
struct ListPosition {
  int64_t index = 0;
  int64_t rankOffset = 0;
};

// ListCache: the entries of spilled lists one agent knows -- read by it (and validated then),
// or written by it -- shared by its threads (StateView::lists()). List keys are write-once, so
// what is known stays true for the job. The heartbeat ring re-targets at every version
// (ringTarget) from it instead of reading its position and its successor's entry again: the
// version that removes a member names the list the agent has seen (round r+1 awaits round r's
// members without it), and a round closed from the counters names entries the agent wrote (its
// own: DynamicRendezvous notes them with its slot). So on a re-form only the new successor's
// entry is read (issue 20's bound on etcd, where the ring's reads are the agent's). Bounded:
// the last kLists lists, kEntries of each.
class ListCache {
 public:
  static constexpr size_t kLists = 4, kEntries = 64;
  void notePosition(int64_t ref, const std::string& id, ListPosition p);
  std::optional<ListPosition> position(int64_t ref, const std::string& id);
  // Entry i's node id.
  void noteEntry(int64_t ref, int64_t i, const std::string& id);
  std::optional<std::string> entry(int64_t ref, int64_t i);

 private:
  struct List {
    int64_t ref = 0;
    std::map<std::string, ListPosition> positions;
    std::map<int64_t, std::string> entries;
  };
  List& of(int64_t ref);  // under mu_; the newest last
  std::mutex mu_;
  std::deque<List> lists_;
};

// With `cache`, a position known to it costs no round trip, and one read is noted in it.
std::optional<ListPosition> position(Store& store, const RoundState& s, RoundState::List which,
                                     const std::string& id, ListCache* cache = nullptr);
// The node the heartbeat ring has `self` watch in state `s`: on a loaded state its successor
// among allIds(); on a compact one the next entry of the member list (the expected list while
// the round is joining). Empty when none (alone, or not in the ring). O(1) round trips, none
// for the entries `cache` knows (it notes those read).
std::string ringTarget(Store& store, const RoundState& s, const std::string& self,
                       ListCache* cache = nullptr);

// StateView: the newest state one agent has seen, shared by its threads. The heartbeat
// monitor picks the node it watches from it, and waits on it for changes.
class StateView {
 public:
  // Called on the offering thread whenever a newer version is offered. Replacing it (or
  // clearing it with nullptr) waits for a call in progress, so the callee may then go away.
  void onChange(std::function<void()> fn);
  void offer(const Versioned& v);
  Versioned get();
  // Blocks until a version newer than `seen` is offered or stop() is called (then false).
  bool waitNewer(int64_t seen);
  void stop();
  // What the agent knows of the lists its versions name.
  ListCache& lists() { return lists_; }

 private:
  ListCache lists_;
  std::mutex mu_;
  std::condition_variable cv_;
  Versioned newest_;
  bool stopped_ = false;
  std::mutex callbackMu_;  // held while onChange_ runs; taken before mu_, never inside it
  std::function<void()> onChange_;
};

}  // namespace ddprun::rendezvous
