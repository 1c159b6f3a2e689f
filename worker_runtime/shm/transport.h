#pragma once
// Transport of the CPU backend: DDPRUN_TRANSPORT=auto|shm|tcp, read by init() (runtime.h).
//   tcp  Gloo plus ddprun's TCP mesh for allreduce (gloo_communicator.h), any placement;
//   shm  shared memory among the ranks of each node: on one node the shm communicator
//        (shm_communicator.h); across nodes the hierarchical one (hierarchical_communicator.h:
//        shm within each node, TCP between the nodes' leaders);
//   auto shm when the job has more than one rank per node and the ranks of each node are on one
//        host, else tcp. A node is a GROUP_RANK: its ranks must report the same boot id and host
//        name through the store, and hold LOCAL_RANK 0..LOCAL_WORLD_SIZE-1 once each. Two nodes
//        on one machine (two agents, as the multi-node tests run) are still two nodes.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace ddprun::runtime::shm {

enum class Transport : uint8_t { Auto, Shm, Tcp };

std::string_view toString(Transport t);
// Case-insensitive; anything else is a ConfigError naming `source` and the value.
Transport parseTransport(std::string_view value, std::string_view source = "DDPRUN_TRANSPORT");

struct TransportChoice {
  Transport transport = Transport::Tcp;  // never Auto
  std::string reason;                    // one line, e.g. "auto: all 4 ranks on one node"
  bool acrossNodes = false;              // shm within several nodes: the hierarchical allreduce
};

// Pure decision. `nodesOnOneHost`: the ranks of every node run on one host (asked through the
// store, see nodesOnOneHost() in shm_communicator.h, and only when the placement allows shm at
// all). Throws ConfigError when shm is requested and impossible.
TransportChoice chooseTransport(Transport requested, int worldSize, int localWorldSize,
                                int groupWorldSize, const std::function<bool()>& nodesOnOneHost);

}  // namespace ddprun::runtime::shm
