#pragma once
// The waiting list of a full round with constant store work per agent (issue 20;
// docs/rendezvous.md, "Keys" and "The waiting list by counters").
//
// A node that arrives at a closed round with MAX members (and not finishing) waits for a place.
// It used to be appended to the round's version: its writer loaded the member and waiting lists
// and wrote the waiting list again (O(N) for that agent, and k arrivals at once raced for one
// version). Instead each registers itself, writing no version:
//   r/<r>/waiting          ADD 1 (a ticket of it on a store with tickets): its index i = 1, 2, ...
//   l/<W>/<i-1>, l/<W>/id/<id>
//                          W = waitingListRef(r): its entry (a `waiting` line) and "<i-1> 0",
//                          write-once, in one MULTI_SET (on etcd one txn that creates all or none)
//   r/<r>/waiting.written  ADD 1 once its entries are written (on etcd a ticket named by the
//                          index, created in the txn that creates the entries)
// then waits on round/<r>/over as before. Whoever ends round r by re-forming it from its member
// list (an eviction, a departure, a restart: StateLog's removeNode and failNode) reads the count
// of the waiting list (readWaitingCount) and round r+1 expects the members and then those K
// waiting nodes (ListRef::waiting): no list is loaded or written, whatever N and K. Every waiting
// node wakes on round/<r>/over whichever transition ends round r, and then takes a slot of the
// round that is joining, so a node left out of K (it registered after the count was read, its
// entry was still being written, or the round ended by a general transition) is a newcomer
// there, never lost.
#include <cstdint>

#include "rendezvous/round_state.h"
#include "rendezvous/store.h"

namespace ddprun::rendezvous::scalable {

// The most waiting nodes a count may name: ddprun-store holds at most 1,000,000 keys by default
// and every waiting node writes two, so a count above this was forged (an attacker's ADD of
// 2^40 would otherwise make a re-form expect, and a loader allocate, 2^40 entries).
inline constexpr int64_t kMaxWaiting = int64_t{1} << 20;

std::string waitingCountKey(int64_t round);
std::string waitingWrittenKey(int64_t round);

// Registers `self` on round `round`'s waiting list; returns its index (1, 2, ...). Three round
// trips on ddprun-store (ADD, MULTI_SET, ADD), two requests on etcd (a ticket, one txn). Call it once per round:
// a second registration of one node in a round is refused by the write-once keys (StoreError).
int64_t joinWaitingList(Store& store, int64_t round, const NodeInfo& self);

// K, the waiting nodes of round `round` whose entries 1..K are all written: on ddprun-store one
// round trip when nobody registered (CHECK; no counter is created), else four (the last, a CHECK
// that entry K-1 exists); on etcd three requests. The written count is read first, then the count. Both only grow and the written count never exceeds the
// count, so when the two agree, every index up to it had written its entries when the written
// count was read. When they differ (an entry in flight, or a holder that died between its index
// and its entries) 0: those nodes re-join as newcomers (above). StoreError on a written count
// above the count; counts that agree but vouch for nothing (above kMaxWaiting, or K with no
// entry K-1: inflated in step) give 0 too, with a warning naming the key and the value.
int64_t readWaitingCount(Store& store, int64_t round);

}  // namespace ddprun::rendezvous::scalable
