#include "launcher/worker_env.h"

namespace ddprun::launcher {

bool setsOmpNumThreads(const Environment& base, int localWorldSize) {
  return localWorldSize > 1 && base.find("OMP_NUM_THREADS") == base.end();
}

Environment workerEnvOverlay(const WorkerEnvInputs& in) {
  const RoundInfo& r = in.round;
  const int globalRank = r.rankOffset + in.localRank;
  auto keepOr = [&](const char* name, const char* fallback) {
    auto it = in.base.find(name);
    return it == in.base.end() ? std::string(fallback) : it->second;
  };
  Environment env{
      {"RANK", std::to_string(globalRank)},
      {"LOCAL_RANK", std::to_string(in.localRank)},
      {"WORLD_SIZE", std::to_string(r.worldSize)},
      {"LOCAL_WORLD_SIZE", std::to_string(in.localWorldSize)},
      {"GROUP_RANK", std::to_string(r.nodeRank)},
      {"GROUP_WORLD_SIZE", std::to_string(r.nodeCount)},
      {"ROLE_NAME", in.role},
      // One role per job: role ranks are the global ranks (as torchrun with a single role).
      {"ROLE_RANK", std::to_string(globalRank)},
      {"ROLE_WORLD_SIZE", std::to_string(r.worldSize)},
      {"MASTER_ADDR", r.masterAddr},
      {"MASTER_PORT", std::to_string(r.masterPort)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(r.restartCount)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(in.maxRestarts)},
      {"TORCHELASTIC_RUN_ID", r.runId},
      {"TORCHELASTIC_USE_AGENT_STORE", r.useAgentStore ? "True" : "False"},
      {"TORCHELASTIC_ERROR_FILE", in.errorFile},
      {"NCCL_ASYNC_ERROR_HANDLING", keepOr("NCCL_ASYNC_ERROR_HANDLING", "1")},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", keepOr("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")},
  };
  if (!in.progressFile.empty()) {
    env["DDPRUN_PROGRESS_FILE"] = in.progressFile;
    env["DDPRUN_PROGRESS_SLOT"] = std::to_string(in.localRank);  // its record in the table
  }
  if (auto it = in.base.find("OMP_NUM_THREADS"); it != in.base.end()) {
    env["OMP_NUM_THREADS"] = it->second;
  } else if (setsOmpNumThreads(in.base, in.localWorldSize)) {
    env["OMP_NUM_THREADS"].assign(1, '1');  // not = "1": GCC 12's false -Wrestrict (PR 105329)
  }
  return env;
}

std::vector<std::string> mergeEnvironment(const Environment& base, const Environment& overlay) {
  Environment merged = base;
  for (const auto& [k, v] : overlay) merged[k] = v;
  std::vector<std::string> out;
  out.reserve(merged.size());
  for (const auto& [k, v] : merged) out.push_back(k + "=" + v);
  return out;
}

}  // namespace ddprun::launcher
