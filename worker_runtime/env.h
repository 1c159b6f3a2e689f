#pragma once
// WorkerEnv: what the launcher (ddprun, or torchrun) tells a worker through its environment.
//
// ddprun and torchrun set the same variables (see docs/worker_runtime.md):
//   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
//   MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RESTART_COUNT,
//   TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID.
// RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are required; the others have torchrun's defaults
// (LOCAL_RANK = RANK, LOCAL_WORLD_SIZE = WORLD_SIZE, no agent store, attempt 0).
// A missing, malformed or inconsistent variable is a ConfigError that names the variable and its
// value, says what is allowed, and suggests starting the program under ddprun.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace ddprun::runtime::shm {
class LentCarry;
}

namespace ddprun::runtime {

struct WorkerEnv {
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  int localWorldSize = 1;
  int groupRank = 0;       // node rank
  int groupWorldSize = 1;  // number of nodes
  std::string masterAddr;
  uint16_t masterPort = 0;
  // True: MASTER_ADDR:MASTER_PORT is the agent's store and every rank is a client of it.
  // False: rank 0 hosts a store at MASTER_PORT (torch 1.13 --standalone behaviour).
  bool useAgentStore = false;
  int restartCount = 0;  // the attempt number; store keys are scoped by it
  int maxRestarts = 0;
  std::string runId;
  // Not from the environment: true once a generation record of in-process recovery moved a
  // lost node's rank to a spare on another node (recovery_keys.h GenerationRecord::moved). The
  // node placement (contiguous ranks per node, LOCAL_WORLD_SIZE each) no longer holds, so the
  // communicator is the flat TCP mesh, which reads ranks only (runtime.cpp makeCommunicator).
  bool ranksOffNode = false;
  // Not from the environment: whether the ranks of every node share a host, once this process
  // has learnt it (shm::nodesOnOneHost, asked through the store in the first generation that
  // needed it). Processes do not move, and the agent starts a replacement on its node's host,
  // so later generations reuse the answer instead of asking every rank again
  // (shm::nodesOnOneHostOnce).
  std::optional<bool> onOneHost;
  // Not from the environment: the lent buffers this process keeps for the next generation's
  // shared-memory communicator (shm/lent_carry.h), made by the first one under in-process
  // recovery; shared by the copies of this struct.
  std::shared_ptr<shm::LentCarry> lentCarry;
};

// Returns the value of an environment variable, or nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// The real process environment (getenv).
std::optional<std::string> processEnv(const std::string& name);

// Reads and validates the worker environment. Throws ConfigError (see above).
WorkerEnv readWorkerEnv(const EnvLookup& lookup = processEnv);

}  // namespace ddprun::runtime
