#include "worker_runtime/env.h"

#include <cerrno>
#include <cstdlib>
#include <limits>

#include "base/errors.h"

namespace ddprun::runtime {
namespace {

constexpr const char* kHint =
    " (this program expects the environment a launcher sets: run it under ddprun, e.g. "
    "`ddprun --standalone --nproc-per-node=2 PROGRAM`, or torchrun)";

[[noreturn]] void bad(const std::string& what) { throw ConfigError(what + kHint); }

std::string required(const EnvLookup& env, const std::string& name) {
  auto v = env(name);
  if (!v || v->empty()) bad("environment variable " + name + " is not set");
  return *v;
}

int64_t parseInt(const std::string& name, const std::string& value, int64_t lo, int64_t hi,
                 const std::string& allowed) {
  errno = 0;
  char* end = nullptr;
  const long long n = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || errno != 0 || *end != '\0' || n < lo || n > hi) {
    bad("environment variable " + name + "='" + value + "' is not valid: expected " + allowed);
  }
  return n;
}

int intVar(const EnvLookup& env, const std::string& name, std::optional<int> fallback, int lo,
           int hi, const std::string& allowed) {
  auto v = env(name);
  if (!v || v->empty()) {
    if (!fallback) bad("environment variable " + name + " is not set");
    return *fallback;
  }
  return static_cast<int>(parseInt(name, *v, lo, hi, allowed));
}

bool boolVar(const EnvLookup& env, const std::string& name) {
  auto v = env(name);
  if (!v || v->empty()) return false;
  const std::string& s = *v;
  if (s == "True" || s == "true" || s == "1") return true;
  if (s == "False" || s == "false" || s == "0") return false;
  bad("environment variable " + name + "='" + s + "' is not valid: expected True or False");
}

}  // namespace

std::optional<std::string> processEnv(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  if (!v) return std::nullopt;
  return std::string(v);
}

WorkerEnv readWorkerEnv(const EnvLookup& env) {
  constexpr int kMax = std::numeric_limits<int>::max();
  WorkerEnv w;
  w.worldSize = intVar(env, "WORLD_SIZE", std::nullopt, 1, kMax, "an integer >= 1");
  w.rank = intVar(env, "RANK", std::nullopt, 0, kMax, "an integer >= 0");
  if (w.rank >= w.worldSize) {
    bad("RANK=" + std::to_string(w.rank) + " is not below WORLD_SIZE=" +
        std::to_string(w.worldSize) + ": expected 0 <= RANK < WORLD_SIZE");
  }
  w.localWorldSize =
      intVar(env, "LOCAL_WORLD_SIZE", w.worldSize, 1, kMax, "an integer >= 1");
  w.localRank = intVar(env, "LOCAL_RANK", w.rank, 0, kMax, "an integer >= 0");
  if (w.localRank >= w.localWorldSize) {
    bad("LOCAL_RANK=" + std::to_string(w.localRank) + " is not below LOCAL_WORLD_SIZE=" +
        std::to_string(w.localWorldSize) + ": expected 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE");
  }
  if (w.localWorldSize > w.worldSize) {
    bad("LOCAL_WORLD_SIZE=" + std::to_string(w.localWorldSize) + " exceeds WORLD_SIZE=" +
        std::to_string(w.worldSize));
  }
  w.groupWorldSize = intVar(env, "GROUP_WORLD_SIZE", 1, 1, kMax, "an integer >= 1");
  w.groupRank = intVar(env, "GROUP_RANK", 0, 0, kMax, "an integer >= 0");
  if (w.groupRank >= w.groupWorldSize) {
    bad("GROUP_RANK=" + std::to_string(w.groupRank) + " is not below GROUP_WORLD_SIZE=" +
        std::to_string(w.groupWorldSize));
  }
  w.masterAddr = required(env, "MASTER_ADDR");
  w.masterPort = static_cast<uint16_t>(
      parseInt("MASTER_PORT", required(env, "MASTER_PORT"), 1, 65535, "a port in 1..65535"));
  w.useAgentStore = boolVar(env, "TORCHELASTIC_USE_AGENT_STORE");
  w.restartCount =
      intVar(env, "TORCHELASTIC_RESTART_COUNT", 0, 0, kMax, "an integer >= 0");
  w.maxRestarts = intVar(env, "TORCHELASTIC_MAX_RESTARTS", 0, 0, kMax, "an integer >= 0");
  w.runId = env("TORCHELASTIC_RUN_ID").value_or("");
  return w;
}

}  // namespace ddprun::runtime
