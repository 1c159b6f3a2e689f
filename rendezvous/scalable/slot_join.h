#pragma once
// The slot join: joining one rendezvous round with a constant number of store round trips and
// bytes per agent, whatever the number of nodes (issue 20; docs/rendezvous.md, "A join with
// constant store work per agent").
//
// Two users:
//   - DynamicRendezvous on the ddprun store (--rdzv-backend=c10d) forms its rounds with
//     takeSlot / readCount / readRecords below; the state log (state_log.h) keeps what the
//     rest of the protocol needs (membership, ranks kept across rounds, waiting list, restarts,
//     the exit barrier), written once per round by the agent that closes it
//     (transition::closeWithSlots). It does not use `closed`.
//   - joinRound: the stand-alone join the simulation measures at 10,000 agents
//     (`ddprun-bench rendezvous --simulate N --protocol slots`), which derives the assignment
//     from the counter alone.
//
// Keys of round r (under the job's prefix):
//   r/<r>/count       ADD 2^32 + nproc by every joiner: the reply packs its slot (high half)
//                     and the processes of slots 1..slot (low half). On a store with tickets
//                     (Store::hasTickets: etcd, where a contended ADD retries) the slot is the
//                     joiner's ticket of r/<r>/count instead (r/<r>/count.t/<id>), and
//                     takeSlot/readCount return no process count (procs 0)
//   r/<r>/node/<s>    the record of slot s, written once by its owner
//   r/<r>/closed      (joinRound) "K P addr port": K node slots, P processes, node rank 0's
//                     address; written once (compare-set on the missing key) by the owner of
//                     slot `target`, or by a member whose last call ran out
// joinRound: node rank = slot - 1, first global rank = P(slot) - nproc, world = P: dense,
// unique and agreed because they derive from one atomic counter. A slot above K is not in the
// round (too late: the caller queues it for the next round).
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "rendezvous/round_state.h"
#include "rendezvous/store.h"

namespace ddprun::rendezvous::scalable {

// The packed counter, and its parser (pure): slot in the high 32 bits, processes in the low.
inline constexpr int64_t kSlotUnit = int64_t{1} << 32;
struct SlotCount {
  int64_t slots = 0;
  int64_t procs = 0;
};
SlotCount unpackCount(int64_t v, const std::string& key);  // StoreError on a negative value

// A slot's record: "id addr nproc master_port". Pure codec; decode throws StoreError naming key.
struct SlotRecord {
  std::string id;
  std::string addr;
  int nproc = 1;
  uint16_t masterPort = 0;
};
std::string encodeRecord(const SlotRecord& r);
SlotRecord decodeRecord(const std::string& text, const std::string& key);

// "K P master_addr master_port": the round's node count and world size, and node rank 0's
// address and port (so that only the closer reads slot 1's record). Validated against maxNodes.
struct Closed {
  SlotCount count;
  std::string masterAddr;
  uint16_t masterPort = 0;
};
std::string encodeClosed(const Closed& c);
Closed decodeClosed(const std::string& text, const std::string& key, int maxNodes);

std::string countKey(int64_t round);
std::string nodeKey(int64_t round, int64_t slot);
std::string closedKey(int64_t round);

struct SlotJoinOptions {
  int64_t round = 1;
  int target = 1;    // the slot that closes the round at once: MAX, or the number expected back
  int minNodes = 1;  // from this slot on, a member's last call may close the round early
  int maxNodes = 1;
  Millis lastCall{30'000};  // after which a member with slot >= minNodes closes the round
  Millis timeout{600'000};  // join_timeout: TimeoutError after it
};

struct Assignment {
  bool admitted = false;  // false: too late for this round (slot above K)
  int64_t slot = 0;
  int nodeRank = -1, nodeCount = 0, rankOffset = 0, worldSize = 0;
  std::string masterAddr;
  uint16_t masterPort = 0;
};

// ---- The pieces DynamicRendezvous forms its rounds with (the state log keeps the membership:
// round_state.h, transition::closeWithSlots) ----

// Takes a slot of round `round` (one ADD, or one ticket) and, when it is within `maxNodes`, writes this node's
// record there (one compare-set against the missing key: a record already there is a forgery,
// StoreError). Returns the slot and the processes of slots 1..slot.
// With `alsoWrite` (arrival ranks, below) the record and the keys alsoWrite(slot) returns go in
// one MULTI_SET instead: every key is write-once on ddprun-store, which refuses (and closes the
// connection of) a MULTI_SET over a key already written; on a store with tickets, one createAll.
using ExtraKeys = std::vector<std::pair<std::string, std::string>>;
SlotCount takeSlot(Store& store, int64_t round, const SlotRecord& self, int maxNodes,
                   const std::function<ExtraKeys(const SlotCount&)>& alsoWrite = {});

// ---- Arrival ranks: the slots are the member list (DynamicRendezvousOptions::arrivalRanks) ----
// With arrival ranks a round closed from the counter has for members its slots 1..K, node rank
// s-1, first global rank P(s) - nproc: each joiner writes its own entry of the round's member
// list (a spilled list, state_log.h, whose ref slotListRef(r) is derived from the round) with its
// record, then counts itself on r/<r>/written, packed as the count: ADD 2^32 (+ P(target) by the
// holder of slot `target`). The joiner whose ADD brings the written slots to `target` knows that
// slots 1..target have all written their entries and that the world size is the low half: it
// closes the round without reading any record (O(1) bytes, however many joined).
inline constexpr int64_t kSlotListBase = kJoinerListBase;  // round_state.h
int64_t slotListRef(int64_t round);
std::string writtenKey(int64_t round);
// On a store with tickets (etcd) the written count is a ticket of r/<r>/written (member: the
// slot) and carries no processes: the holder of slot `target` writes the world size, P(target)
// from its weighted ticket of r/<r>/count, to r/<r>/world with its entries (write-once), and the
// closer reads it with entry 0 (one request). takeSlot with `alsoWrite` takes a weighted ticket
// there (Store::takeWeightedTicket: the processes of slots 1..slot, as the ADD's low half) and
// creates the record and the extra keys in one request (Store::createAll).
std::string worldKey(int64_t round);
// Counts slot `slot` (<= target) written; returns the written slots and the processes counted
// (0 on a store with tickets).
SlotCount markWritten(Store& store, int64_t round, int64_t slot, int64_t target, int64_t procs);
// The slots taken in round `round` so far and their processes (an ADD of 0 reads both at once).
SlotCount readCount(Store& store, int64_t round);
// The records of slots 1..k in slot order, waiting up to `wait` for the ones not written yet
// (one WAIT and one MULTI_GET when all are there). A slot whose record does not appear in time
// is left out: its holder died between its ADD and its record, or is that slow; either way it
// is not in the round (a live one joins the next as a late arrival).
std::vector<SlotRecord> readRecords(Store& store, int64_t round, int64_t k, Millis wait);

// The exit barrier of round `round`: r/<r>/done counts the members whose workers succeeded
// (ADD 1 each, once; a ticket where the store has them), r/<r>/done/<d> (write-once) names the
// d-th.
// Counts this node done; returns d (this node is the d-th).
int64_t markDone(Store& store, int64_t round, const std::string& id);
int64_t readDoneCount(Store& store, int64_t round);
// The ids of done nodes 1..d (one WAIT and one MULTI_GET), waiting up to `wait` for records
// still being written; one that does not appear in time is left out.
std::vector<std::string> readDone(Store& store, int64_t round, int64_t d, Millis wait);

// Joins round `o.round` as `self` and waits until it closes: 3 round trips (ADD, the record,
// the WAIT_GET of `closed`); the closer reads slot 1's record instead of waiting.
Assignment joinRound(Store& store, const SlotRecord& self, const SlotJoinOptions& o);

}  // namespace ddprun::rendezvous::scalable
