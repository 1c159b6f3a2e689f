#pragma once
// RendezvousBackend: where a job's rendezvous keys live and how its nodes watch each other.
//
// DynamicRendezvous (docs/rendezvous.md) is written against the abstract Store and Liveness;
// a backend supplies both:
//   - TcpStoreBackend (here): a ddprun store (or the one an agent hosts) over TCP, keys under
//     "ddprun/rdzv/<run id>/", liveness by a heartbeat ring. --rdzv-backend=c10d and static.
//   - etcd::EtcdBackend (etcd/etcd_backend.h): an etcd v3 cluster, keys under
//     "<key_prefix>/<run id>/", liveness by leases. --rdzv-backend=etcd-v3.
// A backend object is immutable and shared by the agent's threads.
#include <memory>
#include <string>

#include "rendezvous/heartbeat.h"
#include "rendezvous/liveness.h"
#include "rendezvous/tcp_store.h"

namespace ddprun::rendezvous {

class RendezvousBackend {
 public:
  virtual ~RendezvousBackend() = default;
  // The --rdzv-backend name every node of a job must share ("c10d", "static", "etcd-v3").
  virtual std::string name() const = 0;
  // Where the keys are, for messages: "127.0.0.2:29400", "etcd at http://h1:2379,h2:2379".
  virtual std::string describe() const = 0;
  // A new connection to the keys of job `runId` (one per thread). Throws when unreachable.
  virtual InterruptibleStore connect(const std::string& runId) const = 0;
  // Starts announcing this node and watching the others; nullptr when the backend has no
  // liveness (the static backend's fixed membership).
  virtual std::unique_ptr<Liveness> startLiveness(LivenessContext ctx) const = 0;
  // The address this node advertises when --local-addr is not given: the one its traffic to
  // the backend leaves from.
  virtual std::string localAddress() const = 0;
  // Whether rounds form by the slot join (rendezvous/scalable/slot_join.h: constant store work
  // per joiner) rather than by each joiner appending itself to the state log. Every node of a
  // job has the same backend (the settings check), hence the same answer.
  virtual bool slotJoin() const { return false; }
};

// `options` for the heartbeat writer's connection (BoundedConnectFn): connected at its first
// call, its connect, handshake and calls bounded by `within`; a store that accepts it and does
// not answer stopped answering (TcpStoreOptions::answeredBefore).
TcpStoreOptions boundedLazyConnection(TcpStoreOptions options, Millis within);

// A ddprun store over TCP; heartbeats when heartbeat.interval > 0.
class TcpStoreBackend final : public RendezvousBackend {
 public:
  TcpStoreBackend(TcpStoreOptions store, HeartbeatOptions heartbeat, std::string name)
      : store_(std::move(store)), heartbeat_(heartbeat), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  std::string describe() const override;
  InterruptibleStore connect(const std::string& runId) const override;
  std::unique_ptr<Liveness> startLiveness(LivenessContext ctx) const override;
  std::string localAddress() const override;
  // The dynamic backend (c10d) forms rounds by the slot join; the static one (fixed node ranks,
  // MIN = MAX, checked as each node joins) by the state log.
  bool slotJoin() const override { return name_ == "c10d"; }

 private:
  TcpStoreOptions store_;
  HeartbeatOptions heartbeat_;
  std::string name_;
};

}  // namespace ddprun::rendezvous
