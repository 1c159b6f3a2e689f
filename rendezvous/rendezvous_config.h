#pragma once
// Parsing of the multi-node flags' values: --nnodes, --rdzv-endpoint and --rdzv-conf.
// Pure functions; each bad value gets one ConfigError naming the flag, the value and what is
// allowed. The launcher binds the flags; this file knows what they mean.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/dynamic_rendezvous.h"
#include "rendezvous/store_limits.h"

namespace ddprun::rendezvous {

inline constexpr uint16_t kDefaultRendezvousPort = 29400;

// --nnodes=N or MIN:MAX.
JobLimits parseNnodes(const std::string& value);

struct Endpoint {
  std::string host;
  uint16_t port = kDefaultRendezvousPort;
};
// --rdzv-endpoint=HOST[:PORT], with IPv6 as [ADDR] or [ADDR]:PORT.
Endpoint parseEndpoint(const std::string& value, uint16_t defaultPort = kDefaultRendezvousPort);
// --rdzv-endpoint=HOST[:PORT],HOST[:PORT],...: every member of an etcd cluster.
std::vector<Endpoint> parseEndpoints(const std::string& value, uint16_t defaultPort);

// --rdzv-conf=k=v,k=v. Times are in seconds (decimals allowed). Keys: join_timeout,
// last_call_timeout, close_timeout, exit_barrier_timeout, heartbeat (or keep_alive_interval,
// heartbeat_interval), missed_heartbeats (or keep_alive_max_attempt), read_timeout, timeout
// (static backend: its join timeout), is_host, token_file (the store's token, for every agent
// and worker: like DDPRUN_STORE_TOKEN_FILE), rank_order (arrival, the default, or stable:
// node ranks kept from the round before); for etcd-v3: key_prefix, lease_ttl (seconds),
// protocol (http or https), cacert, cert, key (files, for https); for the stores ddprun hosts
// (the rendezvous store and the agent store): store_<limit> for every limit of
// storeLimitNames(), e.g. store_max_connections=1024, store_idle_timeout=600.
struct RendezvousConf {
  std::optional<Millis> joinTimeout, lastCallTimeout, closeTimeout, exitBarrierTimeout;
  std::optional<Millis> heartbeatInterval, readTimeout, staticTimeout;
  std::optional<int> missedHeartbeats;
  std::optional<bool> isHost;
  std::optional<bool> arrivalRanks;  // rank_order=arrival (default)|stable (DynamicRendezvousOptions)
  std::optional<std::string> keyPrefix, protocol, cacert, cert, key, tokenFile;
  std::optional<Millis> leaseTtl;
  std::vector<std::pair<std::string, std::string>> storeLimits;  // (limit name, value), checked
  // Whether a key that only the etcd-v3 backend reads is set (to refuse it elsewhere).
  bool hasEtcdKeys() const { return keyPrefix || protocol || cacert || cert || key || leaseTtl; }
};
RendezvousConf parseRdzvConf(const std::string& value);

// The limits of a store ddprun hosts: the defaults, with what `conf` sets.
ServerLimits storeLimitsFrom(const RendezvousConf& conf);

// Copies what `conf` sets into `options` (read_timeout becomes the store's per-call timeout).
void applyRdzvConf(const RendezvousConf& conf, DynamicRendezvousOptions& options);

}  // namespace ddprun::rendezvous
