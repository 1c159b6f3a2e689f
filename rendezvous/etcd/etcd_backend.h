#pragma once
// EtcdBackend: --rdzv-backend=etcd-v3. The job's rendezvous keys live in an etcd v3 cluster
// under "<key_prefix>/<rdzv id>/" (EtcdStore), and nodes watch each other through leases
// (EtcdLiveness). Every member of the cluster is an endpoint; losing a minority of them is
// invisible to the job (docs/rendezvous.md, "etcd").
#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/rendezvous_backend.h"

namespace ddprun::rendezvous::etcd {

inline constexpr uint16_t kDefaultEtcdPort = 2379;

struct EtcdBackendOptions {
  EtcdClientOptions client;               // endpoints, TLS, read_timeout
  std::string keyPrefix = "/ddprun/rdzv";  // --rdzv-conf key_prefix
  Millis leaseTtl{10'000};                 // --rdzv-conf lease_ttl
};

class EtcdBackend final : public RendezvousBackend {
 public:
  explicit EtcdBackend(EtcdBackendOptions options);
  std::string name() const override { return "etcd-v3"; }
  std::string describe() const override { return describeCluster(options_.client); }
  InterruptibleStore connect(const std::string& runId) const override;
  std::unique_ptr<Liveness> startLiveness(LivenessContext ctx) const override;
  std::string localAddress() const override;
  // Rounds form by the slot join, as on the ddprun store; a slot is a ticket
  // (EtcdStore::takeTicket: one txn, no retry however many nodes join at once).
  bool slotJoin() const override { return true; }
  // "<key_prefix>/<runId>/": every key of the job starts with it.
  std::string jobPrefix(const std::string& runId) const;

 private:
  EtcdBackendOptions options_;
};

}  // namespace ddprun::rendezvous::etcd
