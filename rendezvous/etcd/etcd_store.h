#pragma once
// EtcdStore: the rendezvous Store (rendezvous/store.h) kept in etcd, so that everything
// written against Store -- the round state machine of docs/rendezvous.md above all -- runs
// unchanged on a replicated cluster instead of one agent's memory.
//
// Store key K is etcd key `prefix + K`. How each operation maps onto etcd:
//   set, multiSet        put; one txn of puts (atomic up to kMaxTxnOps keys, then one per
//                        kMaxTxnOps: etcd refuses longer txns)
//   get, multiGet        wait until the keys exist, then range (one txn per kMaxTxnOps keys)
//   compareSet           one txn: compare the value (or, for "", that the key is absent:
//                        create_revision == 0), put on success, range on failure -- so a
//                        loser gets the winner's value in the same round trip
//   add, append          read-modify-write: a txn comparing the key's mod_revision with the
//                        one read, retried on the newer value until it wins
//   check, numKeys       range (count only)
//   takeTicket           one txn: if `<counter>.t/<member>` is absent, count the keys under
//                        `<counter>.t/` and create it -- its number is that count + 1, with no
//                        retry however many members take one at once (an ADD would retry once
//                        per concurrent writer); ticketCount: range (count only);
//                        takeWeightedTicket: the same txn also counts and writes the weight's
//                        keys, one per set bit under `<counter>.w<bit>/`
//   createAll            one txn: every key absent -> put them all
//   readAll              one range, or one txn of ranges (per kMaxTxnOps keys), at one revision
//   compareSetAndSet     compareSet's txn, whose success branch also puts the other keys
//   wait                 range; for a missing key, a watch from the revision of that read + 1
//                        for its PUT (no polling, no event lost between read and watch)
//   deleteKey            deleterange
// A call is bounded by the client's timeout (failover included); get/wait by the Store
// timeout. add/append never apply twice: after an ambiguous failure the key is read again,
// and when it changed meanwhile the call fails with StoreError rather than guess.
#include <atomic>
#include <functional>
#include <mutex>
#include <optional>

#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/etcd/etcd_watch.h"
#include "rendezvous/store.h"

namespace ddprun::rendezvous::etcd {

// etcd's default --max-txn-ops: the most operations one txn may hold.
inline constexpr size_t kMaxTxnOps = 128;

class EtcdStore final : public Store {
 public:
  // `prefix` is prepended to every key, e.g. "/ddprun/rdzv/job42/".
  EtcdStore(EtcdClientOptions options, std::string prefix);

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;  // keys under the prefix
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::string>& values) override;
  void append(const std::string& key, const std::string& value) override;
  bool hasTickets() const override { return true; }
  int64_t takeTicket(const std::string& counter, const std::string& member) override;
  int64_t ticketCount(const std::string& counter) override;
  Ticket takeWeightedTicket(const std::string& counter, const std::string& member,
                            int64_t weight) override;
  void createAll(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;
  std::vector<std::optional<std::string>> readAll(const std::vector<std::string>& keys) override;
  std::string compareSetAndSet(const std::string& key, const std::string& expected,
                               const std::string& desired, const std::vector<std::string>& keys,
                               const std::vector<std::string>& values) override;

  // Any thread: the call in progress and every later one fail with NetworkError.
  void interrupt();
  // Any thread: the call in progress fails with NetworkError.
  void cancelCall();

  EtcdClient& client() { return client_; }
  const std::string& prefix() const { return prefix_; }
  std::string describe() const { return client_.describe(); }

 private:
  using Update = std::function<std::string(const std::optional<std::string>& current)>;
  // Applies `fn` to the key's current value (nullopt: missing) and writes the result, by a
  // txn on the mod_revision read; retried until it wins. Returns the value written.
  std::string readModifyWrite(const std::string& key, const char* op, const Update& fn);
  // The keys' values (nullopt: missing) and the revision they were read at.
  std::pair<std::vector<std::optional<std::string>>, int64_t> read(
      const std::vector<std::string>& keys);
  // The keys under `dir` (etcd key) created at or before `revision`.
  int64_t countCreatedUpTo(const std::string& dir, int64_t revision);
  // Waits for a PUT of `key` after `revision`; throws TimeoutError at the deadline.
  void watchFor(const std::string& key, int64_t revision, Clock::time_point deadline,
                Millis timeout);

  EtcdClient client_;
  std::string prefix_;
  std::mutex mu_;  // guards watch_ against interrupt()/cancelCall()
  EtcdWatch* watch_ = nullptr;
  std::atomic<bool> interrupted_{false};
};

}  // namespace ddprun::rendezvous::etcd
