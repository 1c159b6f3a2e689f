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
                                int groupWorldSize, const std::function<bool()>& oneHost) {
  if (requested == Transport::Tcp) return {Transport::Tcp, "tcp requested"};
  const bool placement = localWorldSize == worldSize && groupWorldSize == 1;
  if (requested == Transport::Shm) {
    if (!placement) {
      throw ConfigError("transport shm was requested but the job spans " +
                        std::to_string(groupWorldSize) + " nodes (LOCAL_WORLD_SIZE=" +
                        std::to_string(localWorldSize) + ", WORLD_SIZE=" +
                        std::to_string(worldSize) +
                        "): shm needs every rank on one node; use DDPRUN_TRANSPORT=tcp or auto");
    }
    if (worldSize > 1 && !oneHost()) {
      throw ConfigError("transport shm was requested but the ranks run on different hosts "
                        "(their boot ids or host names differ): use DDPRUN_TRANSPORT=tcp or auto");
    }
    return {Transport::Shm, "shm requested"};
  }
  if (worldSize == 1) return {Transport::Tcp, "auto: a single rank"};
  if (!placement) return {Transport::Tcp, "auto: the job spans several nodes"};
  if (!oneHost()) return {Transport::Tcp, "auto: the ranks run on different hosts"};
  return {Transport::Shm, "auto: all " + std::to_string(worldSize) + " ranks on one node"};
}

}  // namespace ddprun::runtime::shm
