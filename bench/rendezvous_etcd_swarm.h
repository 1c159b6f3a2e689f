#pragma once
// Simulated agents on the etcd backend: `ddprun-bench rendezvous --simulate N --backend etcd-v3`
// and the tests of tests/etcd/etcd_fibers_test.cpp.
//
// runSwarmOn (bench/rendezvous_swarm.h) against a private etcd: one member of Debian's
// etcd-server (tests/etcd/etcd_cluster.h: a temporary data directory, free loopback client
// and peer ports, killed and its directory removed at the end). Each simulated agent runs the
// etcd backend's real code on fibers: EtcdStore for the join and the state log, and
// EtcdLiveness -- its lease, the keeper's keep-alives every lease_ttl / 3, the watch on its
// ring successor's alive/ key -- so every one of its requests, watches and keep-alives parks
// its fiber (rendezvous/blocking.h). Over gRPC (the default) an agent's clients and watches
// share one HTTP/2 connection (a ChannelPool per agent, rendezvous/etcd/grpc/); over the
// gateway its clients take turns on one connection for their requests (SharedConnections) and
// each watch has its own. Its Store calls are counted (CountingStore): the round
// trips and bytes per agent are Store calls and their payload, as on the ddprun store (an
// etcd get or wait of a missing key is a range and a watch; lease traffic is not counted,
// as heartbeats are not on the ddprun store).
#include <string>

#include "bench/rendezvous_swarm.h"

namespace ddprun::bench {

// Whether the etcd binary the bench was built against (ETCD_BINARY) is installed.
bool etcdInstalled();
std::string etcdBinary();

struct EtcdSwarmOptions {
  Millis leaseTtl{10'000};  // each agent's lease (--rdzv-conf lease_ttl)
  // false: no EtcdLiveness (no lease, no keep-alives, no alive/ watch): the join's and the
  // state log's cost alone, to tell them from the liveness's (--no-leases).
  bool leases = true;
  // true: the JSON gateway (HTTP/1.1: a connection per open watch) instead of gRPC (one
  // HTTP/2 connection per agent carrying its calls and watches).
  bool gateway = false;
  // Where etcd's data directory goes (--etcd-data-parent). The bench's default is /dev/shm, a
  // tmpfs: etcd 3.4 fsyncs its WAL and its backend on every commit and has no flag to stop
  // (--unsafe-no-fsync came with 3.5); on this machine's disk those fsyncs, not etcd's CPU,
  // bound it beyond about 1,000 agents (the applied index lags, keep-alives time out).
  std::string dataParent = "/tmp";
};

// Throws Error when etcd is not installed or does not start, or when N agents would need more
// file descriptors than this process may open.
SwarmResult runEtcdSwarm(const SwarmOptions& options, const EtcdSwarmOptions& etcd = {});

}  // namespace ddprun::bench
