#include "rendezvous/rendezvous_backend.h"

#include "rendezvous/node_address.h"
#include "rendezvous/prefix_store.h"

namespace ddprun::rendezvous {

std::string TcpStoreBackend::describe() const {
  return store_.host + ":" + std::to_string(store_.port);
}

namespace {

InterruptibleStore connectTo(const TcpStoreOptions& options, const std::string& runId) {
  auto tcp = std::make_shared<TcpStore>(options);
  return {std::make_shared<PrefixStore>("ddprun/rdzv/" + runId, tcp),
          [tcp] { tcp->interrupt(); }, [tcp] { tcp->cancelCall(); },
            [tcp](bool on) { tcp->setWaitsCancelled(on); }};
}

}  // namespace

InterruptibleStore TcpStoreBackend::connect(const std::string& runId) const {
  return connectTo(store_, runId);
}

TcpStoreOptions boundedLazyConnection(TcpStoreOptions options, Millis within) {
  options.timeout = within;
  options.connectTimeout = within;
  options.connectInConstructor = false;
  options.answeredBefore = true;  // the agent joined through this store before its heartbeat
  return options;
}

std::unique_ptr<Liveness> TcpStoreBackend::startLiveness(LivenessContext ctx) const {
  if (heartbeat_.interval.count() <= 0) return nullptr;
  return std::make_unique<HeartbeatRing>(
      ctx, heartbeat_, [store = store_, runId = ctx.runId](Millis within) {
        return connectTo(boundedLazyConnection(store, within), runId);
      });
}

std::string TcpStoreBackend::localAddress() const {
  return addressToward(store_.host, store_.port);
}

}  // namespace ddprun::rendezvous
