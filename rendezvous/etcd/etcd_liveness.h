#pragma once
// EtcdLiveness: on etcd, a node is alive while a key of its own, bound to a lease of its own,
// exists. The Liveness of the etcd backend (rendezvous/liveness.h).
//
// Announcing: before it joins, the node grants a lease of lease_ttl seconds and puts
// `alive/<node id>` bound to it; a keeper thread refreshes the lease every lease_ttl / 3. When
// the node stops without a word (kill -9, a machine lost) etcd deletes the key as the lease
// expires; a clean exit revokes the lease, and the key goes at once.
//
// Watching: a thread reads `alive/` and then watches it from the revision after that read
// (a stream, no polling). A node the current state mentions is dead once its key is deleted
// (an event) or found missing by a fresh read; the live node just before it in the ring of
// the state's ids (sorted) evicts it with transition::remove, so one agent writes while every
// agent learns of the death from etcd at once. There are no heartbeat counters.
//
// If the keeper finds its own lease gone (the process was paused longer than the TTL, and the
// others may have evicted it), it takes a new lease and announces itself again; the agent's
// round watcher sees the new round and the node joins it as a newcomer. If etcd cannot be
// reached for min(read_timeout, lease_ttl) -- quorum lost, or this node cut off -- the keeper
// reports the store lost: the agent stops its workers, since the others may already have
// evicted it.
//
// The keeper and the watcher are rendezvous::Background tasks, their waits CondVar and the
// etcd client's (rendezvous/blocking.h): threads for a real agent, fibers of the agent's
// thread for a simulated one (`ddprun-bench rendezvous --simulate --backend etcd`).
#include <atomic>
#include <mutex>
#include <set>

#include "rendezvous/blocking.h"
#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/etcd/etcd_watch.h"
#include "rendezvous/liveness.h"

namespace ddprun::rendezvous::etcd {

struct EtcdLivenessOptions {
  EtcdClientOptions client;  // timeout: read_timeout
  std::string prefix;        // the job's keys, e.g. "/ddprun/rdzv/job42/"
  Millis leaseTtl{10'000};
};

// The key that says node `id` is alive, relative to the job's prefix.
std::string aliveKey(const std::string& id);

// Which node evicts dead node `dead`: the nearest node before it, around the ring of `ids`
// (sorted), that is not dead itself. Empty when every other node is dead.
std::string evictorOf(const std::vector<std::string>& ids, const std::set<std::string>& deadIds,
                      const std::string& dead);

class EtcdLiveness final : public Liveness {
 public:
  // Grants the lease and puts this node's key before returning (throws when etcd cannot be
  // reached); then starts the keeper and the watcher threads.
  EtcdLiveness(EtcdLivenessOptions options, const LivenessContext& ctx);
  ~EtcdLiveness() override;
  void stopWatching() override;
  // Stops the keeper and revokes the lease, so the others learn at once (best effort).
  void stop(bool withdraw) override;

 private:
  void announce(EtcdClient& c);
  void keep();
  void watch();
  // Evicts every dead node this agent is the evictor of; `c` reads unknown nodes' keys. On a
  // compact state (the slot join: the version names its lists) the ring is the heartbeat
  // ring's (ringTarget, read from `store` in O(1)): this agent evicts its successor when dead.
  void evaluate(EtcdClient& c, Store& store, StateLog& log);
  // Whether node `id` is dead, reading its key when the watch has told nothing of it yet.
  bool isDead(EtcdClient& c, const std::string& id);
  void report(std::exception_ptr e);

  EtcdLivenessOptions options_;
  std::string self_;
  JobLimits limits_;
  bool spill_ = false;  // evictions write spilled lists (LivenessContext::spill)
  StateView& view_;
  ConnectFn connect_;
  std::function<void(std::exception_ptr)> onError_;
  std::atomic<int64_t> lease_{0};

  std::mutex mu_;  // guards the flags and the objects other threads cut short
  CondVar cv_;
  bool stopKeeping_ = false;
  bool stopWatching_ = false;
  bool lost_ = false;  // the keeper gave up: etcd unreachable
  EtcdClient* keeperClient_ = nullptr;
  EtcdWatch* watch_ = nullptr;
  std::shared_ptr<EtcdClient> watcherClient_;
  InterruptibleStore evictConn_;

  std::set<std::string> alive_, dead_;  // the watcher thread's view of alive/
  // The ring successor on a compact state, read once per version (the watcher thread's).
  int64_t ringVersion_ = -1;
  std::string ringTarget_;
  Background keeper_;
  Background watcher_;
};

}  // namespace ddprun::rendezvous::etcd
