#pragma once
// The GPU communicator: NCCL, with its unique id exchanged through the ddprun store.
//
// Rank 0 calls ncclGetUniqueId and publishes the 128 bytes under a key of the (attempt-scoped)
// store; the other ranks fetch them, then every rank calls ncclCommInitRank on its CUDA device
// (LOCAL_RANK). Collectives run on the communicator's own CUDA stream, ordered after the work
// already queued on the legacy default stream (the stream LibTorch uses unless told otherwise).
// A watchdog thread polls ncclCommGetAsyncError and each collective's deadline; on an error or a
// timeout it calls ncclCommAbort and fails every pending Work with BackendError. When the
// launcher asked for asynchronous error handling (TORCH_NCCL_ASYNC_ERROR_HANDLING=1 or
// NCCL_ASYNC_ERROR_HANDLING=1, which ddprun and torchrun set), the watchdog then ends the process
// with exit code 1, so that a dead peer becomes a restart even when no thread is waiting.
// Under in-process recovery (NcclOptions::peerLost set) the process stays: the watchdog also
// polls peerLost, and on a peer's death, an error or abort() the communicator is aborted once
// (ncclCommAbort) and every pending and later collective fails with BackendError, which the
// elastic run wrapper turns into a recovery (docs/recovery.md).
//
// Everything here compiles only when CUDA and NCCL were found (DDPRUN_HAVE_NCCL); otherwise
// ncclBuilt() is false and the factories throw ConfigError. See docs/worker_runtime.md for what is
// compiled but untested on machines without a GPU.
#include <functional>
#include <memory>
#include <string>

#include "rendezvous/store.h"
#include "worker_runtime/communicator.h"

namespace ddprun::runtime {

struct NcclOptions {
  int rank = 0;
  int size = 1;
  int device = 0;  // CUDA device index, normally LOCAL_RANK
  Millis timeout = kDefaultCollectiveTimeout;
  // In-process recovery: "" while every peer lives, else why not (elastic::PeerWatch::lost);
  // polled by the watchdog every 100 ms. When set, an asynchronous error does not end the
  // process (the survivors recover), whatever NCCL_ASYNC_ERROR_HANDLING says.
  std::function<std::string()> peerLost;
};

// True when this build contains the NCCL communicator.
bool ncclBuilt();
// The number of CUDA devices this process can use; 0 when built without CUDA or without a driver.
// Without an NVIDIA driver (nvidiaDriverPresent) it asks no CUDA runtime: there, on a machine
// that has the toolkit, the runtime's failed search for the driver cost a forked spare 26-30 ms
// on the way to its ready key (a grow back's path), and every worker's init as much.
int visibleGpuCount();
// Whether an NVIDIA driver a CUDA runtime could reach is on this machine, looked up under `root`
// ("" for the machine's own /): its kernel module (proc/driver/nvidia) or its device nodes
// (dev/nvidiactl, which containers are given; WSL's dev/dxg). CUDA finds no device without one.
bool nvidiaDriverPresent(const std::string& root = "");
// ncclGetUniqueId's 128 bytes. Works without a GPU. Throws ConfigError when built without NCCL,
// BackendError when NCCL fails.
std::string generateNcclUniqueId();

// The unique-id exchange, separated from NCCL so that it is testable anywhere: rank 0 calls
// `generate` and sets `key` to its result; every other rank waits (up to `timeout`) for the key and
// returns its value. Every rank returns the same bytes. Throws BackendError on a wrong-size value.
std::string exchangeUniqueId(rendezvous::Store& store, const std::string& key, int rank,
                             const std::function<std::string()>& generate, Millis timeout,
                             size_t expectedBytes = 128);

// Builds the NCCL communicator (see above). Every rank must call it with the same store.
std::shared_ptr<Communicator> makeNcclCommunicator(std::shared_ptr<rendezvous::Store> store,
                                                   NcclOptions options);

}  // namespace ddprun::runtime
