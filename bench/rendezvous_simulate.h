#pragma once
// ddprun-bench rendezvous --simulate: see rendezvous_simulate.cpp.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ddprun::bench {

struct SimulateOptions {
  std::vector<int> sizes;
  std::vector<std::string> protocols = {"agents"};  // bench/rendezvous_swarm.h: agents, log, slots
  // Where the keys live: "c10d" (a ddprun-store process) or "etcd-v3" (a private etcd,
  // bench/rendezvous_etcd_swarm.h). The CSV's scenario names it: simulate-<protocol>, or
  // simulate-etcd-<protocol>.
  std::string backend = "c10d";
  // etcd-v3 only: false runs the agents without their lease liveness (--no-leases); the
  // scenario is then simulate-etcd-<protocol>-no-leases.
  bool etcdLeases = true;
  // etcd-v3 only: the agents use the JSON gateway (--etcd-transport gateway) instead of gRPC;
  // the scenario then ends in -gateway.
  bool etcdGateway = false;
  std::string etcdDataParent = "/dev/shm";  // EtcdSwarmOptions::dataParent
  std::chrono::milliseconds etcdLeaseTtl{10'000};  // EtcdSwarmOptions::leaseTtl
  uint64_t seed = 1;
  std::chrono::milliseconds spread{200};
  int loops = 1;  // threads running the agents' fibers (SwarmOptions::loops)
  // SwarmOptions::waiting (--waiting W): W agents arrive at the full round and wait; the re-form
  // takes them in. The scenario then ends in -waiting (the note gives W and their cost).
  int waiting = 0;
  bool arrivalRanks = true;  // SwarmOptions::arrivalRanks (--rank-order; the rendezvous's default)
  std::chrono::milliseconds cap{120'000};  // per phase; larger N are skipped once one fails
  std::string storeBinary;                  // ddprun-store
  std::string csv;                          // default bench/results/rendezvous_simulate.csv
  std::string png;                          // empty: no plot
  std::string realCsv;                      // rendezvous.csv: real-process points on the plot
};

// 0, or 77 when --backend etcd-v3 and etcd is not installed (said on stderr).
int simulate(const SimulateOptions& options);

}  // namespace ddprun::bench
