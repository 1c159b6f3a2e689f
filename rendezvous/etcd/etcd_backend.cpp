#include "rendezvous/etcd/etcd_backend.h"

#include "base/errors.h"
#include "rendezvous/etcd/etcd_liveness.h"
#include "rendezvous/etcd/etcd_store.h"
#include "rendezvous/node_address.h"

namespace ddprun::rendezvous::etcd {

EtcdBackend::EtcdBackend(EtcdBackendOptions options) : options_(std::move(options)) {
  while (options_.keyPrefix.size() > 1 && options_.keyPrefix.back() == '/')
    options_.keyPrefix.pop_back();
  if (options_.keyPrefix.empty() || options_.keyPrefix == "/") {
    throw ConfigError("--rdzv-conf key_prefix='" + options_.keyPrefix +
                      "' is not valid (allowed: a non-empty prefix such as /ddprun/rdzv)");
  }
  if (options_.client.endpoints.empty())
    throw ConfigError("--rdzv-backend=etcd-v3 needs --rdzv-endpoint=HOST:PORT[,HOST:PORT...]");
  // Over gRPC the agent's store, round watcher, lease keeper and watcher share one connection
  // per member (every copy of these options shares the pool).
  if (usesGrpc(options_.client) && !options_.client.channels)
    options_.client.channels = std::make_shared<grpc::ChannelPool>();
  if (options_.leaseTtl < Millis(1'000)) {
    throw ConfigError("--rdzv-conf lease_ttl=" + secondsText(options_.leaseTtl) +
                      " is not valid (allowed: at least 1 second; etcd rounds it up to its "
                      "own minimum, 2 s by default)");
  }
}

std::string EtcdBackend::jobPrefix(const std::string& runId) const {
  return options_.keyPrefix + "/" + runId + "/";
}

InterruptibleStore EtcdBackend::connect(const std::string& runId) const {
  auto s = std::make_shared<EtcdStore>(options_.client, jobPrefix(runId));
  return {s, [s] { s->interrupt(); }, [s] { s->cancelCall(); }};
}

std::unique_ptr<Liveness> EtcdBackend::startLiveness(LivenessContext ctx) const {
  return std::make_unique<EtcdLiveness>(
      EtcdLivenessOptions{.client = options_.client, .prefix = jobPrefix(ctx.runId),
                          .leaseTtl = options_.leaseTtl},
      ctx);
}

std::string EtcdBackend::localAddress() const {
  const MemberAddress& m = options_.client.endpoints.front();
  return addressToward(m.host, m.port);
}

}  // namespace ddprun::rendezvous::etcd
