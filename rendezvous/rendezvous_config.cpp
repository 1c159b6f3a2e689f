#include "rendezvous/rendezvous_config.h"

#include <cctype>
#include <sstream>

#include "base/errors.h"

namespace ddprun::rendezvous {

namespace {

bool hasSpace(const std::string& s) {
  for (char c : s)
    if (std::isspace(static_cast<unsigned char>(c))) return true;
  return false;
}

std::optional<long> toInt(const std::string& s) {
  if (s.empty() || s.size() > 9) return std::nullopt;
  for (char c : s)
    if (c < '0' || c > '9') return std::nullopt;
  return std::stol(s);
}

}  // namespace

JobLimits parseNnodes(const std::string& value) {
  auto bad = [&] {
    return ConfigError("--nnodes='" + value +
                       "' is not valid (allowed: N or MIN:MAX with 1 <= MIN <= MAX)");
  };
  JobLimits lim;
  const auto colon = value.find(':');
  auto lo = toInt(value.substr(0, colon));
  auto hi = colon == std::string::npos ? lo : toInt(value.substr(colon + 1));
  if (!lo || !hi || *lo < 1 || *hi < *lo) throw bad();
  lim.minNodes = static_cast<int>(*lo);
  lim.maxNodes = static_cast<int>(*hi);
  return lim;
}

Endpoint parseEndpoint(const std::string& value, uint16_t defaultPort) {
  auto bad = [&](const std::string& why) {
    return ConfigError("--rdzv-endpoint='" + value + "' is not valid (" + why +
                       "; allowed: HOST, HOST:PORT, [IPV6] or [IPV6]:PORT)");
  };
  Endpoint ep;
  ep.port = defaultPort;
  std::string portText;
  if (!value.empty() && value[0] == '[') {
    const auto close = value.find(']');
    if (close == std::string::npos) throw bad("no closing ']'");
    ep.host = value.substr(1, close - 1);
    if (close + 1 < value.size()) {
      if (value[close + 1] != ':') throw bad("expected ':' after ']'");
      portText = value.substr(close + 2);
      if (portText.empty()) throw bad("empty port");
    }
  } else {
    const auto colon = value.rfind(':');
    if (colon != std::string::npos && value.find(':') != colon)
      throw bad("an IPv6 address needs brackets");
    ep.host = value.substr(0, colon);
    if (colon != std::string::npos) {
      portText = value.substr(colon + 1);
      if (portText.empty()) throw bad("empty port");
    }
  }
  if (ep.host.empty()) throw bad("empty host");
  if (!portText.empty()) {
    auto p = toInt(portText);
    if (!p || *p < 1 || *p > 65535) throw bad("port '" + portText + "' is not in 1..65535");
    ep.port = static_cast<uint16_t>(*p);
  }
  return ep;
}

std::vector<Endpoint> parseEndpoints(const std::string& value, uint16_t defaultPort) {
  std::vector<Endpoint> out;
  std::istringstream in(value);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(parseEndpoint(item, defaultPort));
  if (out.empty()) out.push_back(parseEndpoint("", defaultPort));  // throws, naming the value
  return out;
}

RendezvousConf parseRdzvConf(const std::string& value) {
  RendezvousConf conf;
  std::istringstream in(value);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const std::string v = eq == std::string::npos ? "" : item.substr(eq + 1);
    auto seconds = [&]() -> Millis {
      if (const auto ms = parseSecondsValue(v)) return Millis(ms->count());
      throw ConfigError("--rdzv-conf " + key + "='" + v +
                        "' is not valid (allowed: a number of seconds >= 0, e.g. 30 or 0.5)");
    };
    if (eq == std::string::npos) {
      throw ConfigError("--rdzv-conf item '" + item + "' is not valid (allowed: key=value)");
    } else if (key == "join_timeout") {
      conf.joinTimeout = seconds();
    } else if (key == "last_call_timeout") {
      conf.lastCallTimeout = seconds();
    } else if (key == "close_timeout") {
      conf.closeTimeout = seconds();
    } else if (key == "exit_barrier_timeout") {
      conf.exitBarrierTimeout = seconds();
    } else if (key == "heartbeat" || key == "keep_alive_interval" || key == "heartbeat_interval") {
      conf.heartbeatInterval = seconds();
    } else if (key == "read_timeout") {
      conf.readTimeout = seconds();
    } else if (key == "timeout") {
      conf.staticTimeout = seconds();
    } else if (key == "missed_heartbeats" || key == "keep_alive_max_attempt") {
      auto n = toInt(v);
      if (!n || *n < 1) {
        throw ConfigError("--rdzv-conf " + key + "='" + v +
                          "' is not valid (allowed: an integer >= 1)");
      }
      conf.missedHeartbeats = static_cast<int>(*n);
    } else if (key == "lease_ttl") {
      conf.leaseTtl = seconds();
    } else if (key == "key_prefix") {
      if (v.empty() || hasSpace(v)) {
        throw ConfigError("--rdzv-conf key_prefix='" + v +
                          "' is not valid (allowed: a non-empty prefix without spaces)");
      }
      conf.keyPrefix = v;
    } else if (key == "protocol") {
      if (v != "http" && v != "https")
        throw ConfigError("--rdzv-conf protocol='" + v + "' is not valid (allowed: http, https)");
      conf.protocol = v;
    } else if (key == "cacert" || key == "cert" || key == "key") {
      if (v.empty()) throw ConfigError("--rdzv-conf " + key + "='' is not valid (allowed: a file)");
      (key == "cacert" ? conf.cacert : key == "cert" ? conf.cert : conf.key) = v;
    } else if (key == "token_file") {
      if (v.empty()) throw ConfigError("--rdzv-conf token_file='' is not valid (allowed: a file)");
      conf.tokenFile = v;
    } else if (key == "is_host") {
      if (v == "1" || v == "true" || v == "True" || v == "yes") conf.isHost = true;
      else if (v == "0" || v == "false" || v == "False" || v == "no") conf.isHost = false;
      else throw ConfigError("--rdzv-conf is_host='" + v + "' is not valid (allowed: true or false)");
    } else if (key == "rank_order") {
      if (v == "arrival") conf.arrivalRanks = true;
      else if (v == "stable") conf.arrivalRanks = false;
      else throw ConfigError("--rdzv-conf rank_order='" + v + "' is not valid (allowed: stable, arrival)");
    } else if (key.rfind("store_", 0) == 0) {
      ServerLimits check;  // refuses a bad name or value now, naming the key
      setStoreLimit(check, key.substr(6), v, "--rdzv-conf " + key);
      conf.storeLimits.emplace_back(key.substr(6), v);
    } else {
      throw ConfigError("--rdzv-conf key '" + key +
                        "' is unknown (allowed: join_timeout, last_call_timeout, close_timeout, "
                        "exit_barrier_timeout, heartbeat, keep_alive_interval, missed_heartbeats, "
                        "keep_alive_max_attempt, read_timeout, timeout, is_host, token_file, "
                        "rank_order; "
                        "etcd-v3: key_prefix, lease_ttl, protocol, cacert, cert, key; the hosted "
                        "store: store_max_connections, store_max_waiters, store_max_keys, "
                        "store_max_stored_bytes, store_max_value_bytes, store_max_frame_bytes, "
                        "store_max_unsent_reply_bytes, store_handshake_timeout, "
                        "store_frame_timeout, store_idle_timeout)");
    }
  }
  return conf;
}

ServerLimits storeLimitsFrom(const RendezvousConf& conf) {
  ServerLimits limits;
  for (const auto& [name, value] : conf.storeLimits)
    setStoreLimit(limits, name, value, "--rdzv-conf store_" + name);
  return limits;
}

void applyRdzvConf(const RendezvousConf& conf, DynamicRendezvousOptions& o) {
  if (conf.joinTimeout) o.joinTimeout = *conf.joinTimeout;
  if (conf.lastCallTimeout) o.lastCallTimeout = *conf.lastCallTimeout;
  if (conf.closeTimeout) o.closeTimeout = *conf.closeTimeout;
  if (conf.exitBarrierTimeout) o.exitBarrierTimeout = *conf.exitBarrierTimeout;
  if (conf.heartbeatInterval) o.heartbeat.interval = *conf.heartbeatInterval;
  if (conf.missedHeartbeats) o.heartbeat.missedBeats = *conf.missedHeartbeats;
  if (conf.readTimeout) {
    o.store.timeout = *conf.readTimeout;
    o.store.connectTimeout = *conf.readTimeout;
  }
  if (conf.isHost) o.isHost = *conf.isHost;
  if (conf.arrivalRanks) o.arrivalRanks = *conf.arrivalRanks;
}

}  // namespace ddprun::rendezvous
