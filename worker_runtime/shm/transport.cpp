#include "worker_runtime/shm/transport.h"

#include <algorithm>
#include <cctype>

#include "base/errors.h"

namespace ddprun::runtime::shm {

std::string_view toString(Transport t) {
  switch (t) {
    case Transport::Auto: return "auto";
    case Transport::Shm: return "shm";
    case Transport::Tcp: return "tcp";
  }
  return "?";
}

Transport parseTransport(std::string_view value, std::string_view source) {
  std::string v(value);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "auto") return Transport::Auto;
  if (v == "shm") return Transport::Shm;
  if (v == "tcp") return Transport::Tcp;
  throw ConfigError(std::string(source) + "='" + std::string(value) +
                    "' is not a transport: expected auto, shm or tcp");
}

TransportChoice chooseTransport(Transport requested, int worldSize, int localWorldSize,
                                int groupWorldSize, const std::function<bool()>& nodesOnOneHost) {
  if (requested == Transport::Tcp) return {Transport::Tcp, "tcp requested"};
  const bool forced = requested == Transport::Shm;
  if (worldSize == 1) {
    return forced ? TransportChoice{Transport::Shm, "shm requested"}
                  : TransportChoice{Transport::Tcp, "auto: a single rank"};
  }
  const bool oneNode = groupWorldSize == 1 && localWorldSize == worldSize;
  const bool nodes = groupWorldSize > 1 && localWorldSize * groupWorldSize == worldSize;
  const std::string placement = "LOCAL_WORLD_SIZE=" + std::to_string(localWorldSize) +
                                ", GROUP_WORLD_SIZE=" + std::to_string(groupWorldSize) +
                                ", WORLD_SIZE=" + std::to_string(worldSize);
  if (!oneNode && !nodes) {
    if (forced) {
      throw ConfigError("transport shm was requested but the placement is not one of equal "
                        "nodes (" + placement + "): use DDPRUN_TRANSPORT=tcp or auto");
    }
    return {Transport::Tcp, "auto: the placement is not one of equal nodes (" + placement + ")"};
  }
  if (!forced && localWorldSize == 1) return {Transport::Tcp, "auto: one rank per node"};
  if (!nodesOnOneHost()) {
    if (forced) {
      throw ConfigError(std::string("transport shm was requested but ") +
                        (oneNode ? "the ranks run on different hosts"
                                 : "the ranks of a node (GROUP_RANK) run on different hosts") +
                        " (their boot ids or host names differ) or their LOCAL_RANKs do not "
                        "match the placement (" + placement + "): use DDPRUN_TRANSPORT=tcp or auto");
    }
    return {Transport::Tcp, oneNode ? "auto: the ranks run on different hosts"
                                    : "auto: the ranks of a node run on different hosts"};
  }
  const std::string why = forced ? "shm requested" : "auto";
  if (oneNode) {
    return {Transport::Shm, why + ": all " + std::to_string(worldSize) + " ranks on one node"};
  }
  return {Transport::Shm,
          why + ": " + std::to_string(groupWorldSize) + " nodes of " +
              std::to_string(localWorldSize) + " ranks, hierarchical (shm within each node, tcp "
              "between their leaders)",
          true};
}

}  // namespace ddprun::runtime::shm
