#pragma once
// What the two halves of the Runtime share (internal to worker_runtime: no program includes it).
// runtime.cpp starts a process's rank (init(): its store, its first communicator, a spare's wait
// for a rank); runtime_generations.cpp is the Runtime's life after that under in-process
// recovery (the watch of the launcher's next generation, the re-form, the shutdown). Both read
// the same environment and make communicators the same way, with these functions, defined in
// runtime.cpp.
#include <memory>
#include <string>

#include "rendezvous/store.h"
#include "worker_runtime/communicator.h"
#include "worker_runtime/env.h"
#include "worker_runtime/runtime.h"

namespace ddprun::runtime::detail {

// The collectives' timeout: InitOptions::timeout, else DDPRUN_TIMEOUT seconds (ConfigError
// naming a bad value), else 30 min.
Millis timeoutFrom(const InitOptions& o);

// DDPRUN_RECOVERY_TIMEOUT seconds (Runtime::recoveryTimeout), 60 s when unset.
Millis recoveryTimeoutFrom(const InitOptions& o);

// A new connection to the agent's store, in the dialect DDPRUN_STORE_DIALECT names or probes.
std::shared_ptr<rendezvous::Store> connectAgentStore(const WorkerEnv& env, Millis timeout,
                                                     const EnvLookup& lookup);

// Whether the launcher may keep this process alive after a peer's death.
bool inProcessRecoveryWanted(const WorkerEnv& env, const InitOptions& options);

// The communicator of `generation` over the attempt's store (its keys under gen/<g>/ for g > 0).
std::shared_ptr<Communicator> makeCommunicator(WorkerEnv& env,
                                               std::shared_ptr<rendezvous::Store> attemptStore,
                                               const InitOptions& options, int generation);

// A grow record applied to a rank of generation g-1 (`env`); returns the record's cause.
// BackendError naming a record that cannot be read or does not follow g-1.
std::string applyGrow(WorkerEnv& env, const std::string& text, int g);

}  // namespace ddprun::runtime::detail
