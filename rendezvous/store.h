#pragma once
// Store: the key-value interface everything in ddprun meets through.
//
// A store maps string keys to byte strings (std::string is used as a byte container; values
// may hold any bytes, including NUL). It is the same model as PyTorch's c10d::Store, so the
// operations mean what a PyTorch user expects:
//   - get() blocks until the key exists (up to the timeout), then returns its value;
//   - add() treats the value as ASCII decimal, a missing key as 0, and returns the new value;
//   - wait() blocks until every key exists; check() only asks.
// Every blocking call is bounded: by its own timeout argument, or else by timeout(). A call that
// runs out of time throws TimeoutError; a transport failure throws NetworkError; a bad reply
// throws StoreError or ProtocolError. Messages name the store's address and the key.
//
// Implementations: TcpStore (a client of ddprun-store or of any TCPStore server),
// MemoryStore (in-process, for tests), PrefixStore (namespacing on top of another store).
// A Store object is used by one thread at a time unless the implementation says otherwise.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/errors.h"

namespace ddprun::rendezvous {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits until `key` exists, then returns its value.
  virtual std::string get(const std::string& key) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Atomically: if the key's value equals `expected` (a missing key equals ""), store `desired`.
  // Returns the value after the operation (see docs/protocol.md for the missing-key quirk).
  virtual std::string compareSet(const std::string& key, const std::string& expected,
                                 const std::string& desired) = 0;
  // True when every key exists.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Waits until every key exists, or throws TimeoutError after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, Millis timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  // Waits up to `timeout` for `key`, then returns its value; nullopt when it did not appear in
  // time. The default is wait() then get(), two round trips; TcpStore against ddprun-store
  // makes it one (WAIT_GET).
  virtual std::optional<std::string> waitGet(const std::string& key, Millis timeout);
  // Returns true when the key existed.
  virtual bool deleteKey(const std::string& key) = 0;
  virtual int64_t numKeys() = 0;
  // Waits until every key exists, then returns their values in order.
  virtual std::vector<std::string> multiGet(const std::vector<std::string>& keys) = 0;
  virtual void multiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values) = 0;
  // Appends to the value (creating the key when missing).
  virtual void append(const std::string& key, const std::string& value) = 0;

  // Tickets: each distinct `member` that takes a ticket of `counter` gets a number 1, 2, ...:
  // dense, unique, in the order the store saw them, and the same number again if it asks again.
  // A store offers them (hasTickets) when it can do so in a bounded number of round trips however
  // many members take one at once -- the etcd store, whose ADD is a read-modify-write retried
  // once per concurrent writer (O(k) round trips for k at once), numbers a ticket by its key's
  // creation revision instead. The slot join (scalable/slot_join.h) uses tickets where offered,
  // else an ADD. A store without them throws StoreError.
  virtual bool hasTickets() const { return false; }
  virtual int64_t takeTicket(const std::string& counter, const std::string& member);
  // How many tickets of `counter` were taken.
  virtual int64_t ticketCount(const std::string& counter);
  // A weighted ticket: as takeTicket, and the sum of the weights of tickets 1..number (this one's
  // included), read in the same request, as an ADD's reply gives the running sum: the slot join
  // with arrival ranks takes its node rank and first global rank from it (weight: the node's
  // processes, 1..kMaxTicketWeight). A member takes its ticket of a counter either always
  // weighted or never.
  struct Ticket {
    int64_t number = 0;
    int64_t weightThrough = 0;
  };
  static constexpr int64_t kMaxTicketWeight = int64_t{1} << 16;
  virtual Ticket takeWeightedTicket(const std::string& counter, const std::string& member,
                                    int64_t weight);
  // Creates every key with its value, or none: StoreError naming the first key that holds
  // another value (written before: a forgery, or another writer's). Keys already holding exactly
  // these values (a retried request) are no error. One request on a store with tickets (an etcd
  // txn); elsewhere one compare-set per key (ddprun-store's MULTI_SET is write-once for the
  // rendezvous keys by itself, scalable/slot_join.h).
  virtual void createAll(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values);
  // Several reads or writes in one request where the store can (etcd: one txn), so that an
  // agent's store work stays within issue 20's bound of round trips on etcd as on ddprun-store:
  //   - readAll: the keys' values without waiting (nullopt: missing); on etcd at one revision.
  //     Elsewhere one CHECK and, for a key present, one GET per key.
  //   - compareSetAndSet: compareSet, and when it stores `desired` (or finds it, a retried
  //     request) also sets `keys` to `values`, in the same request: the state log's version and
  //     the marker keys it implies (state_log.h). Elsewhere a compareSet and, when it won, one
  //     multiSet. Returns what compareSet returns.
  virtual std::vector<std::optional<std::string>> readAll(const std::vector<std::string>& keys);
  virtual std::string compareSetAndSet(const std::string& key, const std::string& expected,
                                       const std::string& desired,
                                       const std::vector<std::string>& keys,
                                       const std::vector<std::string>& values);

  Millis timeout() const { return timeout_; }
  // Virtual: a store that wraps another (PrefixStore) passes it on.
  virtual void setTimeout(Millis t) { timeout_ = t; }
  // For an agent that is leaving: from now on a reconnect that finds nobody listening at the
  // store's address (connection refused) fails at once instead of retrying until its bound.
  // Its store's host may have gone first (every node got the same signal, or the launching
  // ddprun was killed), and retrying would only hold this agent's exit for that bound. A store
  // that does not reconnect ignores it; one that wraps another passes it on.
  virtual void giveUpWhenRefused() {}

 protected:
  explicit Store(Millis timeout) : timeout_(timeout) {}

 private:
  Millis timeout_;
};

inline std::optional<std::string> Store::waitGet(const std::string& key, Millis timeout) {
  try {
    wait({key}, timeout);
  } catch (const TimeoutError&) {
    return std::nullopt;
  }
  return get(key);
}
inline int64_t Store::takeTicket(const std::string& counter, const std::string&) {
  throw StoreError("this store has no tickets (key '" + counter + "'): use ADD");
}
inline int64_t Store::ticketCount(const std::string& counter) {
  throw StoreError("this store has no tickets (key '" + counter + "'): use ADD");
}
inline Store::Ticket Store::takeWeightedTicket(const std::string& counter, const std::string&,
                                               int64_t) {
  throw StoreError("this store has no tickets (key '" + counter + "'): use ADD");
}
inline void Store::createAll(const std::vector<std::string>& keys,
                             const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    throw StoreError("createAll with " + std::to_string(keys.size()) + " keys but " +
                     std::to_string(values.size()) + " values");
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string got = compareSet(keys[i], "", values[i]);
    if (got != values[i]) {
      throw StoreError("rendezvous key '" + keys[i] + "' holds '" + got.substr(0, 200) +
                       "', written before: it is corrupt or forged");
    }
  }
}

inline std::vector<std::optional<std::string>> Store::readAll(
    const std::vector<std::string>& keys) {
  std::vector<std::optional<std::string>> out;
  for (const auto& k : keys) {
    if (check({k})) {
      out.emplace_back(get(k));
    } else {
      out.emplace_back(std::nullopt);
    }
  }
  return out;
}
inline std::string Store::compareSetAndSet(const std::string& key, const std::string& expected,
                                           const std::string& desired,
                                           const std::vector<std::string>& keys,
                                           const std::vector<std::string>& values) {
  std::string got = compareSet(key, expected, desired);
  if (got == desired && !keys.empty()) multiSet(keys, values);
  return got;
}

// The default per-call timeout, as PyTorch's (300 s).
inline constexpr Millis kDefaultStoreTimeout{300'000};

// `keys` for an error message: each quoted, at most four, then how many there are.
inline std::string quoteKeys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < 4; ++i) {
    if (i) s += ", ";
    s += "'" + keys[i] + "'";
  }
  if (keys.size() > 4) s += ", ... (" + std::to_string(keys.size()) + " keys)";
  return s;
}

}  // namespace ddprun::rendezvous
