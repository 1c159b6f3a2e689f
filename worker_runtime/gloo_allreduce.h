#pragma once
// Allreduce algorithms of the Gloo communicator, written on Gloo's transport (unbound buffers),
// zero-copy on the caller's buffer.
//
// Why not Gloo's own allreduce classes: the classic ones (halving-doubling, ring-chunked) bind
// their buffers at construction, cost tens of milliseconds to build at large sizes and must be
// built in the same order on every rank, so they cannot serve arbitrary tensors without copies;
// the newer gloo::allreduce ring stalls at 16-256 KiB on loopback. Two algorithms cover all sizes:
//   - direct: every rank sends its whole buffer to every other rank in one step and reduces the
//     P inputs locally in rank order. One message latency; (P-1) x N bytes per rank. Small sizes.
//   - ring: reduce-scatter then allgather around the ring, pipelined in segments: a segment is
//     forwarded as soon as it was reduced, and the next receives are posted ahead so the network
//     and the reduction overlap. 2 (P-1)/P x N bytes per rank. Large sizes.
// Both give every rank the same bits: direct reduces in rank order on every rank; ring computes
// each chunk once, on its owner, and copies it to the others.
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include <c10/core/ScalarType.h>

#include "worker_runtime/communicator.h"

namespace gloo {
class Context;
}

namespace ddprun::runtime {

struct ReduceBuffer {
  void* ptr = nullptr;
  size_t count = 0;  // elements
  c10::ScalarType type = c10::ScalarType::Float;
};

struct RingTuning {
  size_t segmentBytes = 512u << 10;  // pipeline granularity
  int window = 4;                    // receives posted ahead
};

class GlooAllreduce {
 public:
  explicit GlooAllreduce(std::shared_ptr<gloo::Context> context);

  // Both throw gloo::IoException (transport failure or deadline); the caller maps it. ReduceOp
  // Avg is reduced as Sum here (the caller divides).
  void direct(const ReduceBuffer& buf, ReduceOp op, std::chrono::steady_clock::time_point deadline);
  void ring(const ReduceBuffer& buf, ReduceOp op, std::chrono::steady_clock::time_point deadline,
            const RingTuning& tuning = {});

 private:
  uint64_t reserveSlots(uint64_t n);

  std::shared_ptr<gloo::Context> context_;
  std::vector<char> scratch_;  // received data before it is reduced
  uint64_t nextSlot_ = 0;
};

}  // namespace ddprun::runtime
