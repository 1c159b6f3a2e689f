#pragma once
// KeyTable: the store's state and its semantics, with no sockets and no threads.
//
// It holds the key -> value map, the FIFO queues, and the waiters: a waiter is an opaque id
// (the server uses one per connection) registered on the keys it still misses. Mutations
// that create a key report which waiters became complete, and the caller decides how to wake
// them. A waiter is complete when every key it waited for exists; cancel() forgets it.
// The server calls this from its single I/O thread; MemoryStore guards it with a mutex.
// Every operation costs O(the bytes it touches): a waiter registers, completes and cancels in
// O(its keys), however many other waiters share them.
#include <cstdint>
#include <deque>
#include <list>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ddprun::rendezvous {

class KeyTable {
 public:
  using WaiterId = uint64_t;
  using Woken = std::vector<WaiterId>;

  void set(const std::string& key, std::string value, Woken& woken);
  const std::string* get(const std::string& key) const;
  // ADD: the value is ASCII decimal, a missing key counts as 0. nullopt when the stored value
  // is not an integer or the sum overflows; the stored value is then left as it was.
  std::optional<int64_t> add(const std::string& key, int64_t delta, Woken& woken);
  // COMPARE_SET with c10d's semantics (see docs/protocol.md), returns the resulting value.
  std::string compareSet(const std::string& key, const std::string& expected,
                         std::string desired, Woken& woken);
  void append(const std::string& key, const std::string& value, Woken& woken);
  bool erase(const std::string& key);
  int64_t size() const { return static_cast<int64_t>(map_.size()); }
  // What the server's caps count: keys plus queues, and the bytes of keys, values and items.
  uint64_t keyCount() const { return map_.size() + queues_.size(); }
  uint64_t bytes() const { return bytes_; }
  // A key exists when it is in the map or names a non-empty queue (as in torch's libuv server).
  bool exists(const std::string& key) const;
  bool check(const std::vector<std::string>& keys) const;

  // The write-once namespace: the versions of a job's rendezvous state, keys
  // `ddprun/rdzv/<run id>/state/<n>` (state_log.h), and the slot join's records and round
  // keys `ddprun/rdzv/<run id>/r/<r>/node/<s>`, `.../r/<r>/closed`, `.../r/<r>/over`
  // (scalable/slot_join.h; its counter `r/<r>/count` is not). Agents write a version once, by
  // COMPARE_SET on the missing key, and never change or delete it; so the server refuses to:
  // an existing version keeps its value whatever a client sends (COMPARE_SET returns it
  // unchanged; SET, APPEND, ADD, MULTI_SET and DELETE_KEY are refused by the server, which
  // closes the connection), and these names are never queues. Without this, any client could
  // delete a version and let two agents both win it, or rewrite one under their feet.
  static bool writeOnce(std::string_view key);
  // `key` is write-once and exists: changing or deleting it must be refused.
  bool frozen(const std::string& key) const { return writeOnce(key) && exists(key); }

  // Registers `id` on the missing keys. Returns true, registering nothing, when all exist.
  // An id may have one registration at a time.
  bool wait(WaiterId id, const std::vector<std::string>& keys);
  // Forgets the waiter (client gone or CANCEL_WAIT). Returns true when it was waiting.
  bool cancel(WaiterId id);
  size_t waiterCount() const { return waiters_.size(); }

  // Queues: PUSH appends and completes at most one waiter on the queue's name.
  void queuePush(const std::string& key, std::string value, Woken& woken);
  // Returns the length before the pop and, when it was > 0, the popped value.
  std::pair<int64_t, std::optional<std::string>> queuePop(const std::string& key);
  int64_t queueLen(const std::string& key) const;

 private:
  // Marks `key` as present for its waiters; with `onlyOne`, completes at most one.
  void keyArrived(const std::string& key, Woken& woken, bool onlyOne = false);

  // A waiter's registration on one key: a node of that key's list (in arrival order, which
  // queues need), pointing back at the waiter's entry for it.
  struct Registration {
    WaiterId id;
    size_t index;  // into Waiter::entries
  };
  using WaitList = std::list<Registration>;
  using KeyWaiters = std::unordered_map<std::string, WaitList>;
  struct Waiter {
    size_t missing = 0;
    // Where it is registered; `list` is null once that key arrived (the list is gone).
    struct Entry {
      KeyWaiters::value_type* list;
      WaitList::iterator node;
    };
    std::vector<Entry> entries;
  };
  void adjustBytes(uint64_t add, uint64_t remove) { bytes_ = bytes_ + add - remove; }

  std::unordered_map<std::string, std::string> map_;
  std::unordered_map<std::string, std::deque<std::string>> queues_;
  KeyWaiters waitersByKey_;  // element addresses are stable (node-based), entries point at them
  std::unordered_map<WaiterId, Waiter> waiters_;
  uint64_t bytes_ = 0;
};

}  // namespace ddprun::rendezvous
