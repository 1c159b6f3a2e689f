#pragma once
// The environment of a worker: the launcher's own environment plus exactly the variables
// torchrun sets, computed by a pure function so tests can check it variable by variable.
//
//   RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE
//   ROLE_NAME ROLE_RANK ROLE_WORLD_SIZE MASTER_ADDR MASTER_PORT
//   TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS TORCHELASTIC_RUN_ID
//   TORCHELASTIC_USE_AGENT_STORE ("True"/"False") TORCHELASTIC_ERROR_FILE
//   NCCL_ASYNC_ERROR_HANDLING, TORCH_NCCL_ASYNC_ERROR_HANDLING (1 unless already set)
//   OMP_NUM_THREADS=1 when the launcher's environment lacks it and there is > 1 worker
#include <string>
#include <vector>

#include "launcher/options.h"
#include "launcher/rendezvous_handler.h"

namespace ddprun::launcher {

struct WorkerEnvInputs {
  const Environment& base;   // the launcher's environment
  const RoundInfo& round;
  int localRank = 0;
  int localWorldSize = 1;
  int maxRestarts = 0;
  std::string role = "default";
  std::string errorFile;     // TORCHELASTIC_ERROR_FILE
  std::string progressFile;  // DDPRUN_PROGRESS_FILE (empty: not set)
};

// Only the variables ddprun sets (or overrides) for this worker.
Environment workerEnvOverlay(const WorkerEnvInputs& in);

// True when ddprun will set OMP_NUM_THREADS=1 (the caller prints a one-line notice).
bool setsOmpNumThreads(const Environment& base, int localWorldSize);

// base with overlay applied, as "KEY=VALUE" strings for execve.
std::vector<std::string> mergeEnvironment(const Environment& base, const Environment& overlay);

}  // namespace ddprun::launcher
