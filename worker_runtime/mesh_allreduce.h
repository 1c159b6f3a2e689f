#pragma once
// The allreduce algorithms of the CPU communicator, on ddprun's own TCP mesh (tcp_mesh.h),
// zero-copy on the caller's buffer.
//   - direct: every rank sends its whole buffer to every other rank in one step and reduces the
//     P inputs locally in rank order. One message latency; (P-1) x N bytes per rank. Small sizes.
//   - halvingDoubling (P a power of two): recursive halving (reduce-scatter) then doubling
//     (allgather) with partners r^1, r^2, ...: log2 P steps each way, 2 (P-1)/P x N bytes per rank.
//   - ring: reduce-scatter then allgather around the ring, pipelined in segments: a segment is
//     forwarded as soon as it was reduced, and the next receives are posted ahead, so the network
//     and the reduction overlap. 2 (P-1)/P x N bytes per rank, 2 (P-1) steps, any P.
// In the last two, received data is reduced segment by segment as it arrives.
// All give every rank the same bits: direct reduces in rank order on every rank; the others
// compute each element once, on its owner, and copy it to the others.
#include <chrono>
#include <memory>
#include <vector>

#include <c10/core/ScalarType.h>

#include "worker_runtime/communicator.h"
#include "worker_runtime/tcp_mesh.h"

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

class MeshAllreduce {
 public:
  explicit MeshAllreduce(std::unique_ptr<TcpMesh> mesh) : mesh_(std::move(mesh)) {}

  // Both throw BackendError (a peer's connection failed) or TimeoutError (deadline). ReduceOp
  // Avg is reduced as Sum here (the caller divides).
  void direct(const ReduceBuffer& buf, ReduceOp op, TcpMesh::Clock::time_point deadline);
  void ring(const ReduceBuffer& buf, ReduceOp op, TcpMesh::Clock::time_point deadline,
            const RingTuning& tuning = {});
  // Needs size() to be a power of two.
  void halvingDoubling(const ReduceBuffer& buf, ReduceOp op, TcpMesh::Clock::time_point deadline,
                       const RingTuning& tuning = {});
  int size() const { return mesh_->size(); }

 private:
  std::unique_ptr<TcpMesh> mesh_;
  std::vector<char> scratch_;  // received data before it is reduced
};

}  // namespace ddprun::runtime
