#pragma once
// EtcdLiveness: on etcd, a node is alive while a key of its own, bound to a lease of its own,
// exists. The Liveness of the etcd backend (rendezvous/liveness.h).
//
// Announcing: before it joins, the node grants a lease of lease_ttl seconds and puts
// `alive/<node id>` bound to it; a keeper thread refreshes the lease every lease_ttl / 3. When
// the node stops without a word (kill -9, a machine lost) etcd deletes the key as the lease
// expires; a clean exit revokes the lease, and the key goes at once.
//
// Watching: the nodes of the newest state form the heartbeat ring of the ddprun store
// (ringTarget, state_log.h: the member list in order, the expected list while a round is
// joining), and each agent watches only its successor's key: it reads `alive/<successor>`
// and watches that one key from the revision after the read (a stream, no polling). When the
// key is missing or deleted (the lease expired, or was revoked) the agent evicts its successor
// with removeNode (state_log.h: an O(1) delta with spilled lists, else transition::remove);
// every agent learns of it from the new round. Two dead in a row:
// evicting the first makes the second this agent's successor in the next version, found
// missing by the read that starts its watch. A watcher that dies is evicted by its own
// predecessor, and so on around the ring. One key read and one watch per node whatever the
// job's size, and one watch event per death: a formation of N nodes costs etcd O(N) (every
// node watching all of `alive/` cost it N^2 events). There are no heartbeat counters.
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

class EtcdLiveness final : public Liveness {
 public:
  // Grants the lease and puts this node's key before returning (throws when etcd cannot be
  // reached); then starts the keeper and the watcher threads.
  EtcdLiveness(EtcdLivenessOptions options, const LivenessContext& ctx);
  ~EtcdLiveness() override;
  void stopWatching() override;
  void haltWatching() override;
  // Stops the keeper and revokes the lease, so the others learn at once (best effort).
  void stop(bool withdraw) override;

 private:
  void announce(EtcdClient& c);
  void keep();
  void watch();
  // The node this agent watches in `v`: its ring successor (O(1) reads of `store`, once per
  // version); empty when alone, not in the ring, or the job is over.
  const std::string& targetIn(Store& store, const Versioned& v);
  // Evicts `target` from the newest state (a compare-set on the state log).
  void evict(StateLog& log, const std::string& target);
  // Publishes the watch in progress (null: none) to stopWatching() and the view's callback.
  void setWatch(EtcdWatch* w);
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
  uint64_t viewChanges_ = 0;  // newer versions offered so far (wakes a watcher with no target)
  EtcdClient* keeperClient_ = nullptr;
  EtcdWatch* watch_ = nullptr;
  std::shared_ptr<EtcdClient> watcherClient_;
  InterruptibleStore evictConn_;

  // The ring successor, read once per version (the watcher thread's).
  int64_t ringVersion_ = -1;
  std::string ringTarget_;
  Background keeper_;
  Background watcher_;
};

}  // namespace ddprun::rendezvous::etcd
