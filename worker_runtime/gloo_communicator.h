#pragma once
// The CPU communicator: Gloo (Debian's libgloo), rendezvoused through a ddprun store.
//
// Each rank publishes its Gloo TCP address in the store and connects to every other rank (Gloo's
// full mesh). Collectives run on CPU tensors. Allreduce picks the algorithm per message size:
// halving-doubling for small and mid sizes (Gloo's ring variants stall for tens of milliseconds at
// 16-256 KiB on loopback) and ring-chunked for large ones; see docs/worker_runtime.md for the
// measured crossover. Algorithm instances are cached per buffer, so a repeated allreduce of the
// same tensor (DDP buckets) pays Gloo's set-up cost once.
#include <memory>
#include <string>

#include "rendezvous/store.h"
#include "worker_runtime/communicator.h"

namespace ddprun::runtime {

// Which allreduce algorithm to use; Auto is the per-size choice described above. The fixed
// choices exist for benchmarks and tests.
enum class GlooAllreduce : uint8_t { Auto, HalvingDoubling, RingChunked };

struct GlooOptions {
  int rank = 0;
  int size = 1;
  Millis timeout = kDefaultCollectiveTimeout;
  // Address (name or IP) other ranks use to reach this one. Empty: GLOO_SOCKET_IFNAME's interface
  // when that variable is set, else this host's name, else 127.0.0.1.
  std::string hostname;
  GlooAllreduce allreduce = GlooAllreduce::Auto;
  // Messages up to this size use halving-doubling under Auto; larger ones ring-chunked.
  size_t ringThresholdBytes = 4u << 20;
};

// Connects the full mesh (every rank must call it with the same store and size). The store may be
// shared with other users: the communicator writes only keys under "gloo/". Throws BackendError
// when the mesh cannot be built within options.timeout.
std::shared_ptr<Communicator> makeGlooCommunicator(std::shared_ptr<rendezvous::Store> store,
                                                   GlooOptions options);

}  // namespace ddprun::runtime
