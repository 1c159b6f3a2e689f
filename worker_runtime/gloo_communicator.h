#pragma once
// The CPU communicator: Gloo (Debian's libgloo), rendezvoused through a ddprun store.
//
// Each rank publishes its Gloo TCP address in the store and connects to every other rank (Gloo's
// full mesh); broadcast, allgather and barrier are Gloo's own collectives. Allreduce -- what DDP
// spends its time in -- runs ddprun's two algorithms (mesh_allreduce.h) on a second mesh of plain
// TCP connections set up through the same store (tcp_mesh.h explains why not Gloo's transport):
// "direct" (one exchange step) for small messages, a pipelined ring for large ones. Gloo's classic
// ring variants stall for tens of milliseconds at 16-256 KiB on loopback, and its halving-doubling
// binds its buffers at construction; docs/worker_runtime.md has the comparison with raw Gloo.
#include <memory>
#include <string>

#include "rendezvous/store.h"
#include "worker_runtime/communicator.h"

namespace ddprun::runtime {

// Which allreduce algorithm to use; Auto is the per-size choice described above. The fixed
// choices exist for benchmarks and tests.
enum class AllreduceAlgorithm : uint8_t { Auto, Direct, Ring, HalvingDoubling };

struct GlooOptions {
  int rank = 0;
  int size = 1;
  Millis timeout = kDefaultCollectiveTimeout;
  // The bound of connecting to the peers (Gloo's pairs, then the allreduce mesh), once every
  // rank has published its addresses; zero: `timeout`. A live peer connects within moments of
  // reading them, so this matters only when a peer died after publishing and before connecting:
  // without it, a rank whose side waits for that peer's connection waited Gloo's connect bound
  // (five times the collective timeout) or the mesh's (the collective timeout). The runtime
  // passes DDPRUN_RECOVERY_TIMEOUT for the generations of an in-process recovery.
  Millis setupTimeout{0};
  // Address (name or IP) other ranks use to reach this one. Empty: GLOO_SOCKET_IFNAME's IPv4
  // address when that variable is set, else this host's name when it resolves, else 127.0.0.1.
  std::string hostname;
  // The allreduce mesh's secret (meshSecret() of the job's token, per attempt): with one, its
  // set-up is a mutual HMAC challenge-response (tcp_mesh.h). Empty: no token.
  std::string meshSecret;
  AllreduceAlgorithm allreduce = AllreduceAlgorithm::Auto;
  // Under Auto, a message of B bytes uses "direct" while B * (size - 1) <= directMaxBytes, else
  // the ring, whose pipeline segments are ringSegmentBytes.
  size_t directMaxBytes = 256u << 10;
  size_t ringSegmentBytes = 512u << 10;
  int ringWindow = 4;  // ring receives posted ahead
  // Under Auto, power-of-two sizes use halving-doubling instead of the ring above directMaxBytes,
  // up to halvingDoublingMaxBytes (its fewer steps win at mid sizes, the ring's finer pipeline at
  // the largest ones).
  bool preferHalvingDoubling = true;
  size_t halvingDoublingMaxBytes = 32u << 20;
};

// Connects the full mesh (every rank must call it with the same store and size). The store may be
// shared with other users: the n-th Gloo communicator of a rank writes only keys under "gloo/".
// Throws BackendError when Gloo's pairs cannot be connected, TimeoutError when the allreduce
// mesh's peers do not connect within options.setupTimeout (store waits: the store's own bounds).
std::shared_ptr<Communicator> makeGlooCommunicator(std::shared_ptr<rendezvous::Store> store,
                                                   GlooOptions options);

}  // namespace ddprun::runtime
