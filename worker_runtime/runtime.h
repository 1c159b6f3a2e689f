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
#include <atomic>
#include <functional>
#include <map>
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
  // A hot spare's warm-up (ddprun --spares; docs/recovery.md#warm-up). init() of a spare calls
  // it once, after connecting to the agent's store and before telling the agent it is ready;
  // init() of a rank never does. In the spare template (worker_runtime/spare/spare_template.h) it runs
  // once, before the template's first fork, with one thread per pool (OMP_NUM_THREADS=1), and
  // the spares forked from it inherit its effect and do not run it again: there it must leave
  // no thread running (join what it starts), or the template cannot fork. It is the program's chance to run its training step once in
  // this process -- LibTorch's kernels and autograd, OpenBLAS's buffers, the allocator, DDP's
  // hooks -- so that, when the spare takes a dead rank, its first real steps run as fast as a
  // survivor's instead of holding the group up. Contract:
  //   - it works on throwaway objects (its own model, optimizer, batch): the spare does not know
  //     its rank yet, the real model is built after init() returns and healed from a survivor;
  //     it must leave nothing the program reads later (seed the global RNG again before the
  //     real model is built, as a program that builds it from a seed does anyway);
  //   - `comm` is a communicator of this process alone (one rank, shared memory, in-process
  //     store) to build DistributedDataParallel on; it is gone after the call. Progress is not
  //     reported during the call (base/progress_file.h, ProgressHold);
  //   - it runs at the spare's priority: SCHED_IDLE for a spare started after a death, so it
  //     costs the training only what an idle-priority process costs; a death meanwhile still
  //     takes the spare (the agent lifts it to normal priority), which reads its rank after;
  //   - what it throws is logged (one line) and ignored: a warm-up only saves time.
  std::function<void(const std::shared_ptr<Communicator>& comm)> spareWarmup;
};

// This worker's place in the job and its connections. Not copyable; destroy it (or call
// shutdown()) before the program exits.
class Runtime {
 public:
  Runtime(WorkerEnv env, std::shared_ptr<rendezvous::Store> store,
          std::shared_ptr<Communicator> comm, std::shared_ptr<void> hostedStore,
          InitOptions options = {}, int generation = 0);
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

  // ---- In-process recovery (docs/recovery.md; worker_runtime/elastic/ uses these) ----
  // The generation of the worker group this process is in: 0 from the group's start; a
  // replacement started by ddprun --recovery=in-process begins in the generation that
  // replaced the dead rank (DDPRUN_GENERATION), survivors move on with reform().
  int generation() const { return generation_; }
  // Whether the launcher may keep this process alive after a peer's death and start a
  // replacement: DDPRUN_RECOVERY=in-process|auto, the agent's store, one node, > 1 rank.
  bool inProcessRecovery() const;
  // Waits, at most `bound`, for the launcher's next generation after generation(); returns the
  // newest one published by then (two deaths in a row: the second). Throws TimeoutError saying
  // that none came (the launcher is restarting the group, or it is not ddprun).
  int awaitNextGeneration(Millis bound);
  // One line of why generation `g` exists (the agent's record), or empty: from the record as
  // reform() read it (no store round trip on a recovery's path). Every reform(g) reads the
  // records up to g first, so a generation this process re-formed into is always known.
  std::string generationCause(int g) const;
  // Leaves the current communicator (abort(): peers waiting on this rank wake at once) and
  // builds generation `g`'s, under keys of its own, with the ranks that are in it then. Under
  // --recovery-policy=shrink a generation may have fewer ranks, or one more (grow back,
  // rendezvous/grow_record.h): rank(), localRank() and worldSize() change here (the ranks kept in
  // order, numbered densely; recovery_keys.h), so a program reads them again after a recovery
  // (getenv("RANK") keeps the start's value: a process's environment cannot follow).
  void reform(int g);
  // init() of a replacement or spare whose generation was superseded while it loaded (a
  // survivor died: the agent published the next generation, superseded_store.h): the process
  // is still in the group (the records name other ranks), so it reform()s into the newest
  // generation instead of failing, and heals there. Throws what reform() throws when no newer
  // generation explains the failure. `why`: the set-up's error, for the log.
  void joinNewestGeneration(std::string why);
  // Tells the agent that this process holds the training state in generation() (it committed
  // or healed): from then on its death, or a peer's, can be recovered in process.
  void announceState();
  // Tells the agent that a collective of this rank failed (recovery_keys.h suspectKey): a hint
  // that lets it see a dying worker before its exit is reaped. Never throws (a store that fails
  // here fails the wait for the next generation, which reports it).
  void reportCollectiveFailure() noexcept;
  // Grow back (docs/recovery.md#grow-back): the agent publishes generation()+1 while every rank
  // is training (a replacement is ready to join), and the ranks are to re-form at their next
  // commit. So that no step pays a store round trip for it, a thread of this runtime, on a
  // connection of its own to the agent's store, WAITs for ddprun/generation/<generation()+1>
  // (in rounds of a minute: no busy loop) and sets a flag; nextGenerationPublished() is a
  // relaxed load of that flag, what ElasticState::commit() checks (runElastic installs it).
  // The flag is a hint only: what the generation is, the ranks read from the store in reform().
  // watchNextGeneration() starts the watch (idempotent; its connection is made then, once);
  // reform(g) re-targets it to g+1 and clears the flag, without a store round trip;
  // shutdown() ends it (the WAIT is interrupted, the thread joined).
  void watchNextGeneration();
  // A hot spare's init() hands over the connection it waited for its rank on, and the watch
  // takes it instead of connecting (ignored once the watch started). Why: a replacement starts
  // the watch just before its first step, which its peers wait for, and a new connection needs
  // the agent's loop, which then may be waiting for the spare template to fork the next spare
  // (15-25 ms here): the replacement's first step waited for that fork.
  void setWatchConnection(std::shared_ptr<rendezvous::Store> connection);
  bool nextGenerationPublished() const {
    return generationPublished_->load(std::memory_order_relaxed);
  }
  // DDPRUN_RECOVERY_TIMEOUT seconds, else 60: the bound of every wait of a recovery outside a
  // collective (the collectives keep their own timeout).
  Millis recoveryTimeout() const;

  // Leaves the job in order: every rank announces it is done, and the rank hosting the store (if
  // any) waits, bounded by the timeout, until all have, so it never takes the store away from a
  // rank still using it. Idempotent; the destructor calls it and swallows its errors (logged).
  void shutdown();

 private:
  WorkerEnv env_;
  std::shared_ptr<rendezvous::Store> store_;
  std::shared_ptr<Communicator> comm_;
  std::shared_ptr<void> hostedStore_;  // a rendezvous::ThreadedStoreServer on rank 0, or null
  InitOptions options_;                // what reform() builds the next communicator from
  int generation_ = 0;
  bool shutDown_ = false;
  // Applies the shrink and grow records of generations generation()+1 .. g to env_
  // (reform()), each once.
  void applyShrinks(int g);
  int shrunkUpTo_ = 0;  // the newest generation whose record applyShrinks() has read
  // The cause of each generation whose record applyShrinks() read (generationCause()).
  std::map<int, std::string> causes_;
  // Several nodes: the node (GROUP_RANK of the start) this process runs on, which a shrink
  // record's per-node counts are indexed by (-1: not read yet).
  int homeNode_ = -1;
  // watchNextGeneration(): the watch of the generation after generation_ (null: none).
  class GenerationWatch;
  std::unique_ptr<GenerationWatch> watch_;
  bool watching_ = false;  // watchNextGeneration() was called
  std::shared_ptr<rendezvous::Store> watchConnection_;  // setWatchConnection()'s, until used
  std::shared_ptr<std::atomic<bool>> generationPublished_ = std::make_shared<std::atomic<bool>>(false);
  void stopWatch();
};

// Builds the Runtime from the environment (see the top of this file). Throws ConfigError for a bad
// environment (naming the variable), NetworkError/TimeoutError when the store cannot be reached,
// BackendError when the communicator cannot be built.
std::unique_ptr<Runtime> init(InitOptions options = {});

// Ends the process with `code` at once: flushes std::cout, std::cerr and C stdio, then
// std::_Exit, so that neither atexit handlers nor static destructors run. LibTorch's free its
// operator registry chunk by chunk, 0.1-0.9 s per process on a VM where a page's first write is
// dear (more in a process whose pages a fork shares: each free is a copy-on-write fault), and a
// job ends only when its slowest rank has exited (docs/trainers.md). For the last line of a
// program's main(), once the Runtime is gone or shut down (its error file written, its threads
// joined) and the program has joined its own threads and closed its own files: nothing of them
// is finished here. Timeline events need nothing: each is one write(2) as it happens.
[[noreturn]] void exitProcess(int code);

}  // namespace ddprun::runtime

namespace ddprun {
using runtime::exitProcess;
using runtime::init;
}
