#pragma once
// Transport of the CPU backend: DDPRUN_TRANSPORT=auto|shm|tcp, read by init() (runtime.h).
//   tcp  Gloo plus ddprun's TCP mesh for allreduce (gloo_communicator.h), any placement;
//   shm  shared memory (shm_communicator.h): every rank must be on one node;
//   auto shm when the job has more than one rank and all are on one node (LOCAL_WORLD_SIZE ==
//        WORLD_SIZE, one group, and the ranks' boot id and host name agree), else tcp.
// Jobs across nodes use tcp (a hierarchical shm + tcp allreduce is not built yet).
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
};

// Pure decision. `oneHost`: every rank runs on this host (asked through the store, and only when
// the placement allows shm at all). Throws ConfigError when shm is requested and impossible.
TransportChoice chooseTransport(Transport requested, int worldSize, int localWorldSize,
                                int groupWorldSize, const std::function<bool()>& oneHost);

}  // namespace ddprun::runtime::shm
