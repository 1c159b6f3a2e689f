// The one place that maps LaunchOptions to a RendezvousHandler. Multi-node backends plug in
// here; the agent only ever sees the interface.
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs it in C++20

#include "launcher/local_rendezvous.h"
#include "launcher/multinode_rendezvous.h"
#include "launcher/option_values.h"
#include "launcher/options.h"
#include "base/errors.h"

namespace ddprun::launcher {

std::unique_ptr<RendezvousHandler> makeRendezvousHandler(boost::asio::io_context& io,
                                                         const LaunchOptions& o) {
  // Several nodes (--nnodes=N>1 or MIN:MAX): the store-based rendezvous, docs/rendezvous.md;
  // etcd-v3 always, even for one node (the job is in the cluster, under its id).
  if (o.maxNodes > 1 || o.rdzvBackend == "etcd-v3")
    return std::make_unique<MultiNodeRendezvous>(io, o);
  if (o.nodeRank != 0) {
    throw ConfigError("--node-rank=" + std::to_string(o.nodeRank) +
                      ": expected 0 for a single-node job (--nnodes=1)");
  }
  LocalRendezvousOptions local{.runId = o.rdzvId, .maxRestarts = o.maxRestarts,
                               .agentStore = o.agentStore, .storeLimits = hostedStoreLimits(o)};
  if (o.standalone) {
    // A free port on loopback: a second job on this machine can never collide with us.
    local.masterAddr = local.bindAddr = "127.0.0.1";
    local.port = 0;
  } else if (o.rdzvBackend == "c10d" && !o.rdzvEndpoint.empty()) {
    // One node of c10d: the store at the endpoint (torchrun's default port 29400).
    Endpoint ep = parseEndpoint(o.rdzvEndpoint);
    local.masterAddr = ep.host;
    local.bindAddr = resolveAddress(ep.host);
    local.port = ep.port.value_or(29400);
  } else if (o.rdzvBackend == "c10d") {
    throw ConfigError("--rdzv-backend=c10d needs --rdzv-endpoint=HOST[:PORT] (or use "
                      "--standalone)");
  } else {
    // static: node 0 hosts the store at --master-addr:--master-port, as torchrun does.
    local.masterAddr = o.masterAddr;
    local.bindAddr = resolveAddress(o.masterAddr);
    local.port = static_cast<uint16_t>(o.masterPort);
  }
  try {
    return std::make_unique<LocalRendezvous>(io, local);
  } catch (const NetworkError& e) {
    throw NetworkError(std::string(e.what()) +
                       " (another job may hold this port: use --standalone for a free port, "
                       "or choose one with --master-port)");
  }
}

}  // namespace ddprun::launcher
