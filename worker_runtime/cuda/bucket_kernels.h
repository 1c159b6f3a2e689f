#pragma once
// CUDA kernels of DDP's buckets (compiled by nvcc when the CUDA language is available; see
// worker_runtime/CMakeLists.txt, which defines DDPRUN_HAVE_CUDA_KERNELS then).
#include <cstdint>

namespace ddprun::runtime::cuda {

// One gradient to place in a bucket: `length` elements at `src`, to go to `offset` in the bucket.
struct FlattenPiece {
  const void* src;
  int64_t offset;
  int64_t length;
};

enum class Element : uint8_t { Float32, Float64, Float16, BFloat16 };

// bucket[piece.offset + j] = piece.src[j] * scale for every piece, in one launch per 64 pieces, on
// `stream` (a cudaStream_t; nullptr is the legacy default stream). Asynchronous: returns after
// enqueueing. Throws BackendError when the launch fails.
void flattenScale(void* bucket, const FlattenPiece* pieces, int count, Element type, double scale,
                  void* stream);

}  // namespace ddprun::runtime::cuda
