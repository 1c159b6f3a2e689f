#pragma once
// The agents ddprun-bench rendezvous starts, one Peer per launcher and backend: ddprun on c10d
// (the store hosted by agent 0), ddprun on etcd-v3, torchrun 1.13 on c10d. Every "node" is an
// agent process with its own loopback address 127.0.1.<i+1>.
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/paths.h"

namespace {

struct Peer {
  std::string name;
  // argv of agent `i` of `n`, meeting at 127.0.1.1:port; `program` is the worker command.
  std::function<std::vector<std::string>(int i, int n, int minNodes, uint16_t port,
                                         const std::string& id,
                                         const std::vector<std::string>& program)>
      argv;
  // How long a killed agent goes unnoticed at most (the recovery scenario's bound, + 0.2 s).
  std::chrono::milliseconds detection{3'000};
};

// `extraConf`: more --rdzv-conf settings for every agent ("rank_order=arrival"), or "".
Peer ddprunPeer(const std::string& extraConf = "") {
  return {"ddprun", [extraConf](int i, int n, int minNodes, uint16_t port, const std::string& id,
                                const std::vector<std::string>& program) {
            std::vector<std::string> a = {
                ddprun::bench::programDir() + "/ddprun",
                "--nnodes=" + std::to_string(minNodes) + ":" + std::to_string(n),
                "--nproc-per-node=1", "--rdzv-backend=c10d",
                "--rdzv-endpoint=127.0.1.1:" + std::to_string(port), "--rdzv-id=" + id,
                "--local-addr=127.0.1." + std::to_string(i + 1),
                "--rdzv-conf=heartbeat=1,missed_heartbeats=3" +
                    (extraConf.empty() ? "" : "," + extraConf),
                "--no-python"};
            a.insert(a.end(), program.begin(), program.end());
            return a;
          }};
}

Peer torchrunPeer(const std::string& python) {
  return {"torchrun", [python](int i, int n, int minNodes, uint16_t port, const std::string& id,
                               const std::vector<std::string>& program) {
            std::vector<std::string> a = {
                python, ddprun::bench::scriptPath("torchrun_wrapper.py"),
                "--nnodes=" + std::to_string(minNodes) + ":" + std::to_string(n),
                "--nproc_per_node=1", "--rdzv_backend=c10d",
                "--rdzv_endpoint=127.0.1.1:" + std::to_string(port), "--rdzv_id=" + id,
                "--rdzv_conf=is_host=" + std::string(i == 0 ? "1" : "0") +
                    ",keep_alive_interval=1,keep_alive_max_attempt=3",
                "--monitor_interval=0.1", "--no_python"};
            a.insert(a.end(), program.begin(), program.end());
            return a;
          }};
}

// ddprun on an etcd cluster: lease_ttl 3 s, as the heartbeat timeout of the c10d runs (1 s x 3);
// etcd checks for expired leases every 0.5 s.
Peer ddprunEtcdPeer(const std::string& endpoints) {
  return {"etcd-v3",
          [endpoints](int i, int n, int minNodes, uint16_t, const std::string& id,
                      const std::vector<std::string>& program) {
            std::vector<std::string> a = {
                ddprun::bench::programDir() + "/ddprun",
                "--nnodes=" + std::to_string(minNodes) + ":" + std::to_string(n),
                "--nproc-per-node=1", "--rdzv-backend=etcd-v3", "--rdzv-endpoint=" + endpoints,
                "--rdzv-id=" + id, "--local-addr=127.0.1." + std::to_string(i + 1),
                "--rdzv-conf=lease_ttl=3", "--no-python"};
            a.insert(a.end(), program.begin(), program.end());
            return a;
          },
          std::chrono::milliseconds(3'500)};
}

}  // namespace
