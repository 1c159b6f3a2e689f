#include "bench/rendezvous_etcd_swarm.h"

#include <sys/resource.h>

#include <fstream>

#include "base/errors.h"
#include "rendezvous/counting_store.h"
#include "rendezvous/etcd/etcd_backend.h"
#include "rendezvous/etcd/etcd_store.h"
#include "rendezvous/store_server.h"
#include "tests/etcd/etcd_cluster.h"  // a private etcd, as the tests start one

namespace ddprun::bench {

using namespace ddprun::rendezvous;
using rendezvous::etcd::EtcdBackend;
using rendezvous::etcd::EtcdBackendOptions;
using rendezvous::etcd::EtcdStore;

namespace {

// EtcdBackend with every Store connection counted into one StoreTraffic; its liveness (the
// lease and the alive/ watch) is the backend's own.
class CountingEtcdBackend final : public RendezvousBackend {
 public:
  CountingEtcdBackend(EtcdBackendOptions options, std::shared_ptr<StoreTraffic> traffic,
                      bool slotJoin, bool leases)
      : inner_(options), client_(options.client), traffic_(std::move(traffic)),
        slotJoin_(slotJoin), leases_(leases) {}
  std::string name() const override { return inner_.name(); }
  std::string describe() const override { return inner_.describe(); }
  InterruptibleStore connect(const std::string& runId) const override {
    auto s = std::make_shared<EtcdStore>(client_, inner_.jobPrefix(runId));
    return {std::make_shared<CountingStore>(s, traffic_), [s] { s->interrupt(); },
            [s] { s->cancelCall(); }};
  }
  std::unique_ptr<Liveness> startLiveness(LivenessContext ctx) const override {
    if (!leases_) return nullptr;
    return inner_.startLiveness(std::move(ctx));
  }
  std::string localAddress() const override { return "127.0.0.1"; }
  bool slotJoin() const override { return slotJoin_; }

 private:
  EtcdBackend inner_;
  rendezvous::etcd::EtcdClientOptions client_;
  std::shared_ptr<StoreTraffic> traffic_;
  bool slotJoin_;
  bool leases_;
};

class EtcdSwarmStore final : public SwarmStore {
 public:
  EtcdSwarmStore(Millis timeout, const EtcdSwarmOptions& etcd)
      : cluster_(1, {}, nullptr, etcd.dataParent),
        options_{.client = cluster_.clientOptions(timeout), .leaseTtl = etcd.leaseTtl},
        timeout_(timeout), leases_(etcd.leases) {
    options_.client.transport =
        etcd.gateway ? rendezvous::etcd::Transport::Gateway : rendezvous::etcd::Transport::Grpc;
  }
  // gRPC: each agent's clients and watches share one connection (its own ChannelPool).
  // Gateway: its clients take turns on one connection for their requests (SharedConnections);
  // its watches have theirs.
  std::shared_ptr<const RendezvousBackend> backend(std::shared_ptr<StoreTraffic> traffic,
                                                   bool slotJoin) const override {
    EtcdBackendOptions o = options_;
    o.client.shared = std::make_shared<rendezvous::etcd::SharedConnections>();
    o.client.channels = std::make_shared<rendezvous::etcd::grpc::ChannelPool>();  // gRPC
    return std::make_shared<CountingEtcdBackend>(o, std::move(traffic), slotJoin, leases_);
  }
  std::shared_ptr<Store> connect(const std::string& runId) const override {
    return std::make_shared<EtcdStore>(options_.client,
                                       options_.keyPrefix + "/" + runId + "/");
  }
  TcpStoreOptions storeOptions() const override {
    return {.host = "127.0.0.1", .timeout = timeout_, .connectTimeout = timeout_};
  }
  double cpuSeconds() const override { return cluster_.cpuSeconds(); }

 private:
  etcdtest::EtcdCluster cluster_;
  EtcdBackendOptions options_;
  Millis timeout_;
  bool leases_;
};

// Over gRPC an agent holds one connection: 1 descriptor per agent in this process and one
// socket in etcd. Over the gateway its clients take turns on one connection
// (SharedConnections) and its watches hold one each -- its join's or its round watcher's, and
// its lease watcher's -- and every connection of a thread shares that thread's io_context:
// 3.0 descriptors per agent, measured at 256 agents (it was about 27 with a connection per
// client and an io_context per connection), and as many in etcd. Raises the limit as far as
// allowed (the hard limit too, with CAP_SYS_RESOURCE; etcd inherits it) and returns it.
uint64_t fdsPerAgent(bool gateway) { return gateway ? 3 : 1; }
uint64_t raiseFileLimits() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max < (1u << 20)) {
    rlimit want{1u << 20, 1u << 20};
    (void)::setrlimit(RLIMIT_NOFILE, &want);  // refused without the capability: the old limit
  }
  return raiseFileLimit();
}

}  // namespace

std::string etcdBinary() { return etcdtest::kEtcdBinary; }
bool etcdInstalled() { return std::ifstream(etcdtest::kEtcdBinary).good(); }

SwarmResult runEtcdSwarm(const SwarmOptions& o, const EtcdSwarmOptions& etcd) {
  if (!etcdInstalled())
    throw Error(etcdBinary() + " not found: etcd is not installed (Debian etcd-server)");
  if (o.protocol == "slots")
    throw ConfigError("--protocol slots runs on the ddprun store only (rendezvous/scalable/)");
  // Refused up front: running out of descriptors half-way would end the process (an
  // io_context that cannot be made throws on an agent's background fiber).
  const uint64_t limit = raiseFileLimits();
  const uint64_t perAgent = fdsPerAgent(etcd.gateway);
  const uint64_t need = perAgent * static_cast<uint64_t>(o.agents) + 256;
  if (need > limit) {
    throw Error(std::to_string(o.agents) + " simulated agents on etcd need about " +
                std::to_string(need) + " file descriptors in this process (" +
                std::to_string(perAgent) +
                (etcd.gateway ? " per agent: an HTTP connection for its requests and one per "
                                "watch, its round's and its ring successor's key"
                              : " per agent: its HTTP/2 connection") +
                "); RLIMIT_NOFILE is " +
                std::to_string(limit) + " and its hard limit cannot be raised here");
  }
  EtcdSwarmStore store(o.timeout, etcd);
  return runSwarmOn(store, o);
}

}  // namespace ddprun::bench
