#pragma once
// Pure parsers for the values of ddprun's flags. Each returns the parsed value or throws
// BadValue carrying "what is allowed"; the caller adds the flag, the value and its source,
// so every message reads: ddprun: --flag=value: expected <allowed>.
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/errors.h"
#include "launcher/options.h"

namespace ddprun::launcher {

// What was wrong with a value, without the flag and the value (the caller adds them). An Error,
// but not a ConfigError: its message alone is no complete answer to the user, so no handler of
// ConfigError may take it for one; every caller of a parser catches it (options.cpp).
class BadValue : public Error {
 public:
  explicit BadValue(const std::string& allowed) : Error(allowed) {}
};

// A decimal integer in [min, max].
int parseInt(std::string_view v, int min, int max);
// A non-negative number of seconds ("30", "0.5").
double parseSeconds(std::string_view v);
// 1/0, true/false, yes/no, on/off (any case).
bool parseBool(std::string_view v);
// --nnodes: "N" or "MIN:MAX" with 1 <= MIN <= MAX.
std::pair<int, int> parseNodeRange(std::string_view v);
// --redirects / --tee: "0".."3", or "LOCAL_RANK:0..3,..." .
StreamSelection parseStreamSelection(std::string_view v);
// --local-ranks-filter: "0,1,3" (empty means every rank).
std::set<int> parseRankList(std::string_view v);
// --rdzv-conf: "k=v,k2=v2" (empty allowed). Keys may not repeat.
std::vector<std::pair<std::string, std::string>> parseKeyValues(std::string_view v);
// --signals-to-handle: "SIGTERM,SIGINT", names with or without SIG, or numbers.
std::vector<int> parseSignalList(std::string_view v);

// host[:port], with IPv6 hosts in brackets ("[::1]:29400").
struct Endpoint {
  std::string host;
  std::optional<uint16_t> port;
};
Endpoint parseEndpoint(std::string_view v);
// --rdzv-endpoint for etcd-v3: one or more endpoints separated by commas (every member).
std::vector<Endpoint> parseEndpointList(std::string_view v);

// --nproc-per-node: N >= 1, "cpu", "gpu" (error when there is no CUDA device) or "auto".
// The device counts are asked through the callbacks so tests can fake them.
struct DeviceCounts {
  std::function<int()> cpus;
  std::function<int()> gpus;  // 0 when there is none
};
int parseNproc(std::string_view v, const DeviceCounts& devices);

// "SIGTERM" for 15; "signal 77" for numbers without a name.
std::string signalName(int sig);

}  // namespace ddprun::launcher
