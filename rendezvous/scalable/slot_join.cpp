#include "rendezvous/scalable/slot_join.h"

#include <algorithm>
#include <charconv>
#include <sstream>
#include <vector>

#include "base/errors.h"

namespace ddprun::rendezvous::scalable {

namespace {

constexpr int kMaxNproc = 65536;  // as a state's member line (round_state_codec.cpp)

std::vector<std::string_view> words(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && s[i] == ' ') ++i;
    size_t j = i;
    while (j < s.size() && s[j] != ' ') ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

template <typename T>
bool number(std::string_view w, T& v) {
  auto r = std::from_chars(w.data(), w.data() + w.size(), v);
  return r.ec == std::errc() && r.ptr == w.data() + w.size();
}

bool printable(std::string_view s) {
  return !s.empty() && s.size() <= 256 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

bool addressChars(std::string_view a) {
  return !a.empty() && a.size() <= 255 && std::all_of(a.begin(), a.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ||
           c == ':' || c == '%' || c == '[' || c == ']';
  });
}

[[noreturn]] void forged(const std::string& key, const std::string& value, const char* why) {
  throw StoreError("rendezvous key '" + key + "' holds '" + value.substr(0, 200) +
                   "', which is corrupt or forged (" + why + ")");
}

Millis until(Clock::time_point t) {
  return std::max(Millis(0), std::chrono::duration_cast<Millis>(t - Clock::now()));
}

// Waits up to `timeout` for `key`, then returns its value; nullopt when it did not appear.
std::optional<std::string> waitGet(Store& store, const std::string& key, Millis timeout) {
  if (timeout.count() <= 0) {
    if (!store.check({key})) return std::nullopt;
    return store.get(key);
  }
  if (timeout >= store.timeout()) return store.get(key);  // one round trip (WAIT_GET)
  try {
    store.wait({key}, timeout);
  } catch (const TimeoutError&) {
    return std::nullopt;
  }
  return store.get(key);
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
  if (!printable(w[0])) forged(key, text, "the node id");
  if (!addressChars(w[1])) forged(key, text, "the address");
  if (!number(w[2], r.nproc) || r.nproc < 1 || r.nproc > kMaxNproc) forged(key, text, "nproc");
  if (!number(w[3], r.masterPort)) forged(key, text, "the port");
  r.id = std::string(w[0]);
  r.addr = std::string(w[1]);
  return r;
}

SlotCount decodeClosed(const std::string& text, const std::string& key, int maxNodes) {
  const auto w = words(text);
  SlotCount c;
  if (w.size() != 2 || !number(w[0], c.slots) || !number(w[1], c.procs))
    forged(key, text, "not 'nodes processes'");
  if (c.slots < 1 || c.slots > maxNodes) forged(key, text, "a node count outside 1..MAX");
  if (c.procs < c.slots || c.procs > c.slots * kMaxNproc) forged(key, text, "the world size");
  return c;
}

std::string countKey(int64_t round) { return "r/" + std::to_string(round) + "/count"; }
std::string nodeKey(int64_t round, int64_t slot) {
  return "r/" + std::to_string(round) + "/node/" + std::to_string(slot);
}
std::string closedKey(int64_t round) { return "r/" + std::to_string(round) + "/closed"; }

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
      const std::string want = std::to_string(mine.slots) + " " + std::to_string(mine.procs);
      closedText = store.compareSet(closed, "", want);
    } else {
      const bool lastCall = mine.slots >= o.minNodes;
      auto wakeAt = lastCall ? std::min(deadline, Clock::now() + o.lastCall) : deadline;
      for (;;) {
        if (auto v = waitGet(store, closed, until(wakeAt))) {
          closedText = *v;
          break;
        }
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
        closedText = store.compareSet(
            closed, "", std::to_string(now.slots) + " " + std::to_string(now.procs));
        break;
      }
    }
  } else {
    // Past MAX: not in this round whatever happens; learn how it closed.
    closedText = *waitGet(store, closed, o.timeout);
  }
  const SlotCount k = decodeClosed(closedText, closed, o.maxNodes);
  if (mine.slots > k.slots) return a;  // too late for this round
  // 4. The assignment, derived; MASTER_ADDR:PORT from node rank 0's record.
  a.admitted = true;
  a.nodeRank = static_cast<int>(mine.slots - 1);
  a.nodeCount = static_cast<int>(k.slots);
  a.rankOffset = static_cast<int>(mine.procs - self.nproc);
  a.worldSize = static_cast<int>(k.procs);
  if (mine.slots == 1) {
    a.masterAddr = self.addr;
    a.masterPort = self.masterPort;
  } else {
    const std::string first = nodeKey(o.round, 1);
    const SlotRecord master = decodeRecord(store.get(first), first);
    a.masterAddr = master.addr;
    a.masterPort = master.masterPort;
  }
  return a;
}

}  // namespace ddprun::rendezvous::scalable
