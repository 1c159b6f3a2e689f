#include "rendezvous/scalable/slot_join.h"

#include <algorithm>
#include <charconv>
#include <sstream>
#include <vector>

#include "base/errors.h"
#include "rendezvous/round_state.h"
#include "rendezvous/text_fields.h"

namespace ddprun::rendezvous::scalable {

namespace {

using text::number;
using text::words;

[[noreturn]] void forged(const std::string& key, const std::string& value, const char* why) {
  throw StoreError("rendezvous key '" + key + "' holds '" + value.substr(0, 200) +
                   "', which is corrupt or forged (" + why + ")");
}

Millis until(Clock::time_point t) {
  return std::max(Millis(0), std::chrono::duration_cast<Millis>(t - Clock::now()));
}

// Waits up to `timeout` for `key`, then returns its value; nullopt when it did not appear
// (possibly earlier: a wait of at least the connection's timeout is one WAIT_GET of that long,
// and the caller loops until its own deadline).
std::optional<std::string> waitGet(Store& store, const std::string& key, Millis timeout) {
  if (timeout.count() <= 0) {
    if (!store.check({key})) return std::nullopt;
    return store.get(key);
  }
  if (timeout >= store.timeout()) {
    try {
      return store.get(key);
    } catch (const TimeoutError&) {
      return std::nullopt;
    }
  }
  try {
    store.wait({key}, timeout);
  } catch (const TimeoutError&) {
    return std::nullopt;
  }
  return store.get(key);
}

// The value of `closed` for a round of `count` (the closer holds slot `mine`): node rank 0's
// address from slot 1's record (one GET, waiting for it if slot 1's owner has not written it
// yet), or from `self` when the closer holds slot 1.
std::string closing(Store& store, int64_t round, const SlotRecord& self, const SlotCount& mine,
                    const SlotCount& count) {
  Closed c{.count = count};
  if (mine.slots == 1) {
    c.masterAddr = self.addr;
    c.masterPort = self.masterPort;
  } else {
    const std::string first = nodeKey(round, 1);
    const SlotRecord master = decodeRecord(store.get(first), first);
    c.masterAddr = master.addr;
    c.masterPort = master.masterPort;
  }
  return encodeClosed(c);
}

}  // namespace

SlotCount unpackCount(int64_t v, const std::string& key) {
  if (v < 0) forged(key, std::to_string(v), "a negative count");
  return {v >> 32, v & (kSlotUnit - 1)};
}

std::string encodeRecord(const SlotRecord& r) {
  return r.id + " " + r.addr + " " + std::to_string(r.nproc) + " " + std::to_string(r.masterPort);
}

SlotRecord decodeRecord(const std::string& text, const std::string& key) {
  const auto w = words(text);
  SlotRecord r;
  if (w.size() != 4) forged(key, text, "not 'id addr nproc master_port'");
  if (!text::validId(w[0])) forged(key, text, "the node id");
  if (!text::validAddress(w[1])) forged(key, text, "the address");
  if (!number(w[2], r.nproc) || r.nproc < 1 || r.nproc > kMaxNproc) forged(key, text, "nproc");
  if (!number(w[3], r.masterPort)) forged(key, text, "the port");
  r.id = std::string(w[0]);
  r.addr = std::string(w[1]);
  return r;
}

std::string encodeClosed(const Closed& c) {
  return std::to_string(c.count.slots) + " " + std::to_string(c.count.procs) + " " + c.masterAddr +
         " " + std::to_string(c.masterPort);
}

Closed decodeClosed(const std::string& text, const std::string& key, int maxNodes) {
  const auto w = words(text);
  Closed c;
  if (w.size() != 4 || !number(w[0], c.count.slots) || !number(w[1], c.count.procs) ||
      !number(w[3], c.masterPort))
    forged(key, text, "not 'nodes processes master_addr master_port'");
  if (c.count.slots < 1 || c.count.slots > maxNodes) forged(key, text, "a node count outside 1..MAX");
  if (c.count.procs < c.count.slots || c.count.procs > c.count.slots * kMaxNproc)
    forged(key, text, "the world size");
  if (!text::validAddress(w[2])) forged(key, text, "the master address");
  c.masterAddr = std::string(w[2]);
  return c;
}

std::string countKey(int64_t round) { return "r/" + std::to_string(round) + "/count"; }
std::string nodeKey(int64_t round, int64_t slot) {
  return "r/" + std::to_string(round) + "/node/" + std::to_string(slot);
}
std::string closedKey(int64_t round) { return "r/" + std::to_string(round) + "/closed"; }

SlotCount takeSlot(Store& store, int64_t round, const SlotRecord& self, int maxNodes,
                   const std::function<ExtraKeys(const SlotCount&)>& alsoWrite) {
  const std::string ck = countKey(round);
  SlotCount mine;
  if (!store.hasTickets()) {
    mine = unpackCount(store.add(ck, kSlotUnit + self.nproc), ck);
  } else if (alsoWrite) {  // the processes of slots 1..slot too: a weighted ticket
    const Store::Ticket t = store.takeWeightedTicket(ck, self.id, self.nproc);
    mine = {.slots = t.number, .procs = t.weightThrough};
    if (mine.procs < mine.slots || mine.procs > mine.slots * kMaxNproc)
      forged(ck, std::to_string(mine.procs), "the processes of the slots up to this node's");
  } else {
    mine = {.slots = store.takeTicket(ck, self.id)};
  }
  if (mine.slots < 1) forged(ck, std::to_string(mine.slots), "a slot below 1");
  if (mine.slots <= maxNodes && alsoWrite) {
    std::vector<std::string> keys{nodeKey(round, mine.slots)}, values{encodeRecord(self)};
    for (auto& [k, v] : alsoWrite(mine)) {
      keys.push_back(std::move(k));
      values.push_back(std::move(v));
    }
    // ddprun-store's MULTI_SET is write-once for these keys; elsewhere (etcd) one txn creates all.
    if (store.hasTickets()) {
      store.createAll(keys, values);
    } else {
      store.multiSet(keys, values);
    }
  } else if (mine.slots <= maxNodes) {
    const std::string rec = encodeRecord(self), nk = nodeKey(round, mine.slots);
    const std::string got = store.compareSet(nk, "", rec);
    if (got != rec) forged(nk, got, "another node's record in this node's slot");
  }
  return mine;
}

int64_t slotListRef(int64_t round) { return kSlotListBase + round; }
std::string writtenKey(int64_t round) { return "r/" + std::to_string(round) + "/written"; }

std::string worldKey(int64_t round) { return "r/" + std::to_string(round) + "/world"; }

SlotCount markWritten(Store& store, int64_t round, int64_t slot, int64_t target, int64_t procs) {
  const std::string wk = writtenKey(round);
  const SlotCount w =
      store.hasTickets()
          ? SlotCount{.slots = store.takeTicket(wk, std::to_string(slot))}
          : unpackCount(store.add(wk, kSlotUnit + (slot == target ? procs : 0)), wk);
  // (More than `target` is possible: a joiner that saw the target before a removal lowered it.)
  if (w.slots < 1) forged(wk, std::to_string(w.slots), "a written count below 1");
  return w;
}

SlotCount readCount(Store& store, int64_t round) {
  const std::string ck = countKey(round);
  if (store.hasTickets()) return {.slots = store.ticketCount(ck)};
  return unpackCount(store.add(ck, 0), ck);
}

std::vector<SlotRecord> readRecords(Store& store, int64_t round, int64_t k, Millis wait) {
  std::vector<std::string> keys;
  for (int64_t s = 1; s <= k; ++s) keys.push_back(nodeKey(round, s));
  if (keys.empty()) return {};
  try {
    store.wait(keys, wait);
  } catch (const TimeoutError&) {
    std::vector<std::string> present;
    for (const auto& key : keys)
      if (store.check({key})) present.push_back(key);
    keys = std::move(present);
    if (keys.empty()) return {};
  }
  const std::vector<std::string> values = store.multiGet(keys);
  std::vector<SlotRecord> out;
  for (size_t i = 0; i < keys.size(); ++i) out.push_back(decodeRecord(values[i], keys[i]));
  return out;
}

namespace {
std::string doneKey(int64_t round) { return "r/" + std::to_string(round) + "/done"; }
std::string doneRecordKey(int64_t round, int64_t d) { return doneKey(round) + "/" + std::to_string(d); }
}  // namespace

int64_t markDone(Store& store, int64_t round, const std::string& id) {
  const std::string dk = doneKey(round);
  const int64_t d = store.hasTickets() ? store.takeTicket(dk, id) : store.add(dk, 1);
  if (d < 1) forged(dk, std::to_string(d), "a done count below 1");
  const std::string rk = doneRecordKey(round, d);
  const std::string got = store.compareSet(rk, "", id);
  if (got != id) forged(rk, got, "another node's id in this node's done record");
  return d;
}

int64_t readDoneCount(Store& store, int64_t round) {
  const std::string dk = doneKey(round);
  const int64_t d = store.hasTickets() ? store.ticketCount(dk) : store.add(dk, 0);
  if (d < 0) forged(dk, std::to_string(d), "a negative done count");
  return d;
}

// Keeps the keys of `keys` that exist within `wait` (all of them, usually, at the first WAIT).
std::vector<std::string> present(Store& store, std::vector<std::string> keys, Millis wait) {
  if (keys.empty()) return keys;
  try {
    store.wait(keys, wait);
    return keys;
  } catch (const TimeoutError&) {
  }
  std::vector<std::string> out;
  for (const auto& key : keys)
    if (store.check({key})) out.push_back(key);
  return out;
}

std::vector<std::string> readDone(Store& store, int64_t round, int64_t d, Millis wait) {
  std::vector<std::string> keys;
  for (int64_t i = 1; i <= d; ++i) keys.push_back(doneRecordKey(round, i));
  keys = present(store, std::move(keys), wait);
  if (keys.empty()) return {};
  std::vector<std::string> ids = store.multiGet(keys);
  for (size_t i = 0; i < ids.size(); ++i)
    if (!text::validId(ids[i])) forged(keys[i], ids[i], "not a node id");
  return ids;
}

Assignment joinRound(Store& store, const SlotRecord& self, const SlotJoinOptions& o) {
  const auto deadline = Clock::now() + o.timeout;
  const std::string ck = countKey(o.round), closed = closedKey(o.round);
  // 1. The slot and the processes up to it, in one atomic step.
  const SlotCount mine = unpackCount(store.add(ck, kSlotUnit + self.nproc), ck);
  Assignment a;
  a.slot = mine.slots;
  std::string closedText;
  if (mine.slots <= o.maxNodes) {
    // 2. The record, write-once: another value there is a forgery.
    const std::string rec = encodeRecord(self), nk = nodeKey(o.round, mine.slots);
    const std::string got = store.compareSet(nk, "", rec);
    if (got != rec) forged(nk, got, "another node's record in this node's slot");
    // 3. Close the round, or wait for it to close.
    if (mine.slots == o.target) {
      closedText = store.compareSet(closed, "", closing(store, o.round, self, mine, mine));
    } else {
      const bool lastCall = mine.slots >= o.minNodes;
      auto wakeAt = lastCall ? std::min(deadline, Clock::now() + o.lastCall) : deadline;
      for (;;) {
        if (auto v = waitGet(store, closed, until(wakeAt))) {
          closedText = *v;
          break;
        }
        if (Clock::now() < wakeAt) continue;  // a slice of a longer wait
        if (Clock::now() >= deadline) {
          throw TimeoutError("rendezvous round " + std::to_string(o.round) + " did not close " +
                             "within the join timeout (this node has slot " +
                             std::to_string(mine.slots) + ")");
        }
        // The last call ran out: close with whoever has a slot now (an ADD of 0 reads both
        // numbers atomically). At or past target, the target's owner closes: wait for it.
        const SlotCount now = unpackCount(store.add(ck, 0), ck);
        if (now.slots >= o.target) {
          wakeAt = deadline;
          continue;
        }
        closedText = store.compareSet(closed, "", closing(store, o.round, self, mine, now));
        break;
      }
    }
  } else {
    // Past MAX: not in this round whatever happens; learn how it closed.
    for (;;) {
      if (auto v = waitGet(store, closed, until(deadline))) {
        closedText = *v;
        break;
      }
      if (Clock::now() >= deadline)
        throw TimeoutError("rendezvous round " + std::to_string(o.round) + " did not close " +
                           "within the join timeout");
    }
  }
  const Closed k = decodeClosed(closedText, closed, o.maxNodes);
  if (mine.slots > k.count.slots) return a;  // too late for this round
  // 4. The assignment, derived.
  a.admitted = true;
  a.nodeRank = static_cast<int>(mine.slots - 1);
  a.nodeCount = static_cast<int>(k.count.slots);
  a.rankOffset = static_cast<int>(mine.procs - self.nproc);
  a.worldSize = static_cast<int>(k.count.procs);
  a.masterAddr = k.masterAddr;
  a.masterPort = k.masterPort;
  return a;
}

}  // namespace ddprun::rendezvous::scalable
