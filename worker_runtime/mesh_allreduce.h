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
//
// Framing: every allreduce starts with a 16-byte CollectiveHeader from each rank to every
// other (sequence number, dtype, element count, op, algorithm), queued before the payload on
// the same connections. Each rank checks every peer's header before it reads a payload byte
// from that peer, so ranks that disagree (a tensor of another size or dtype, another
// algorithm) all throw BackendError naming both shapes instead of reading each other's bytes.
// The headers travel with the payload (no extra round trip): P-1 small sends per collective.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
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

// What a rank is about to reduce, as sent to every peer before the payload.
struct CollectiveHeader {
  uint32_t seq = 0;      // allreduces on this mesh so far
  uint8_t magic = 0xA7;  // a stray byte stream is not mistaken for a header
  uint8_t dtype = 0;     // c10::ScalarType
  uint8_t op = 0;        // ReduceOp
  uint8_t algorithm = 0; // 1 direct, 2 ring, 3 halving-doubling
  uint64_t count = 0;    // elements
  bool operator==(const CollectiveHeader&) const = default;
};
static_assert(sizeof(CollectiveHeader) == 16);

// "rank 1: allreduce #3 of 12 elements of Float (sum, ring)" (pure).
std::string describeHeader(int rank, const CollectiveHeader& h);

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
  // Shuts the mesh's connections down (TcpMesh::abort).
  void abort() { mesh_->abort(); }

 private:
  // Queues this rank's header to every peer and the receipt of theirs, each checked on
  // arrival (before that peer's payload); the algorithm's progress() completes them.
  void announce(const ReduceBuffer& buf, ReduceOp op, uint8_t algorithm);

  std::unique_ptr<TcpMesh> mesh_;
  std::vector<char> scratch_;  // received data before it is reduced
  uint32_t seq_ = 0;
  CollectiveHeader mine_;
  std::vector<CollectiveHeader> theirs_;
};

}  // namespace ddprun::runtime
