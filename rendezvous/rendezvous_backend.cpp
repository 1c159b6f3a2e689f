#include "rendezvous/rendezvous_backend.h"

#include "rendezvous/node_address.h"
#include "rendezvous/prefix_store.h"

namespace ddprun::rendezvous {

std::string TcpStoreBackend::describe() const {
  return store_.host + ":" + std::to_string(store_.port);
}

InterruptibleStore TcpStoreBackend::connect(const std::string& runId) const {
  auto tcp = std::make_shared<TcpStore>(store_);
  return {std::make_shared<PrefixStore>("ddprun/rdzv/" + runId, tcp),
          [tcp] { tcp->interrupt(); }, [tcp] { tcp->cancelCall(); },
            [tcp](bool on) { tcp->setWaitsCancelled(on); }};
}

std::unique_ptr<Liveness> TcpStoreBackend::startLiveness(LivenessContext ctx) const {
  if (heartbeat_.interval.count() <= 0) return nullptr;
  return std::make_unique<HeartbeatRing>(ctx, heartbeat_);
}

std::string TcpStoreBackend::localAddress() const {
  return addressToward(store_.host, store_.port);
}

}  // namespace ddprun::rendezvous
