#pragma once
// ddprun::init(): the one entry point of a training program that runs under ddprun.
//
//   int main() {
//     auto rt = ddprun::init();                 // env -> store -> communicator
//     auto model = std::make_shared<Net>();
//     ddprun::runtime::DistributedDataParallel ddp(model, rt->comm());
//     ...
//   }
//
// init() reads the worker environment (env.h), connects to the store and builds the communicator:
//   - TORCHELASTIC_USE_AGENT_STORE=True (ddprun's default): MASTER_ADDR:MASTER_PORT is the agent's
//     store and every rank connects to it as a client. DDPRUN_STORE_DIALECT=ddprun|current|legacy
//     says what kind of server it is; unset, init() tries a ddprun-store first and falls back to a
//     torch TCPStore (legacy, then current framing), so the program also runs under torchrun.
//   - Otherwise (torch 1.13 --standalone, ddprun --no-agent-store): rank 0 hosts a store at
//     MASTER_PORT on its own thread, the others connect to it, as PyTorch's env:// init does.
// Keys are scoped per attempt: "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>/", the prefix
// PyTorch uses, so a restarted group never sees the keys of the group before it.
//
// The backend comes from InitOptions::backend, else DDPRUN_BACKEND, else auto (backend.h); the
// choice is logged in one line. Collective and store timeouts come from InitOptions::timeout, else
// DDPRUN_TIMEOUT (seconds), else 30 minutes.
#include <memory>
#include <optional>

#include "rendezvous/store.h"
#include "worker_runtime/backend.h"
#include "worker_runtime/communicator.h"
#include "worker_runtime/env.h"

namespace ddprun::runtime {

struct InitOptions {
  std::optional<Backend> backend;  // unset: DDPRUN_BACKEND, else Auto
  std::optional<Millis> timeout;   // unset: DDPRUN_TIMEOUT seconds, else 30 min
  EnvLookup env = processEnv;      // tests inject their own environment
};

// This worker's place in the job and its connections. Not copyable; destroy it (or call
// shutdown()) before the program exits.
class Runtime {
 public:
  Runtime(WorkerEnv env, std::shared_ptr<rendezvous::Store> store,
          std::shared_ptr<Communicator> comm, std::shared_ptr<void> hostedStore);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const WorkerEnv& env() const { return env_; }
  int rank() const { return env_.rank; }
  int worldSize() const { return env_.worldSize; }
  int localRank() const { return env_.localRank; }
  bool isMaster() const { return env_.rank == 0; }
  // The attempt number (TORCHELASTIC_RESTART_COUNT): 0 on the first start.
  int attempt() const { return env_.restartCount; }

  // The store, scoped to this attempt. Shared by threads (TcpStore serializes calls).
  const std::shared_ptr<rendezvous::Store>& store() const { return store_; }
  const std::shared_ptr<Communicator>& comm() const { return comm_; }
  // Where tensors for comm() must live: CPU for Gloo, cuda:LOCAL_RANK for NCCL.
  torch::Device device() const { return comm_->device(); }

  // Leaves the job in order: every rank announces it is done, and the rank hosting the store (if
  // any) waits, bounded by the timeout, until all have, so it never takes the store away from a
  // rank still using it. Idempotent; the destructor calls it and swallows its errors (logged).
  void shutdown();

 private:
  WorkerEnv env_;
  std::shared_ptr<rendezvous::Store> store_;
  std::shared_ptr<Communicator> comm_;
  std::shared_ptr<void> hostedStore_;  // a rendezvous::ThreadedStoreServer on rank 0, or null
  bool shutDown_ = false;
};

// Builds the Runtime from the environment (see the top of this file). Throws ConfigError for a bad
// environment (naming the variable), NetworkError/TimeoutError when the store cannot be reached,
// BackendError when the communicator cannot be built.
std::unique_ptr<Runtime> init(InitOptions options = {});

}  // namespace ddprun::runtime

namespace ddprun {
using runtime::init;
}
