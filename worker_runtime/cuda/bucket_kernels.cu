// flattenScale: gathers the gradients of one DDP bucket into its flat buffer and multiplies them by
// 1 / world size, in one kernel launch per batch of pieces (one block row per piece).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "base/errors.h"
#include "worker_runtime/cuda/bucket_kernels.h"

namespace ddprun::runtime::cuda {
namespace {

constexpr int kPiecesPerLaunch = 64;

struct Batch {
  FlattenPiece pieces[kPiecesPerLaunch];
  int count;
};

template <typename T>
__device__ inline T scaled(T v, double s) {
  return static_cast<T>(static_cast<float>(v) * static_cast<float>(s));
}
template <>
__device__ inline double scaled<double>(double v, double s) {
  return v * s;
}

template <typename T>
__global__ void flattenScaleKernel(T* bucket, Batch batch, double scale) {
  const FlattenPiece p = batch.pieces[blockIdx.y];
  const T* src = static_cast<const T*>(p.src);
  T* dst = bucket + p.offset;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < p.length;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = scaled(src[i], scale);
  }
}

template <typename T>
void launch(void* bucket, const FlattenPiece* pieces, int count, double scale, cudaStream_t s) {
  for (int first = 0; first < count; first += kPiecesPerLaunch) {
    Batch batch{};
    batch.count = count - first < kPiecesPerLaunch ? count - first : kPiecesPerLaunch;
    int64_t longest = 1;
    for (int i = 0; i < batch.count; ++i) {
      batch.pieces[i] = pieces[first + i];
      if (pieces[first + i].length > longest) longest = pieces[first + i].length;
    }
    const int threads = 256;
    const int64_t wanted = (longest + threads - 1) / threads;
    const dim3 grid(static_cast<unsigned>(wanted < 1024 ? wanted : 1024),
                    static_cast<unsigned>(batch.count));
    flattenScaleKernel<T><<<grid, threads, 0, s>>>(static_cast<T*>(bucket), batch, scale);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
      throw BackendError(std::string("CUDA: flattenScale launch failed: ") + cudaGetErrorString(e));
    }
  }
}

}  // namespace

void flattenScale(void* bucket, const FlattenPiece* pieces, int count, Element type, double scale,
                  void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  switch (type) {
    case Element::Float32: return launch<float>(bucket, pieces, count, scale, s);
    case Element::Float64: return launch<double>(bucket, pieces, count, scale, s);
    case Element::Float16: return launch<__half>(bucket, pieces, count, scale, s);
    case Element::BFloat16: return launch<__nv_bfloat16>(bucket, pieces, count, scale, s);
  }
}

}  // namespace ddprun::runtime::cuda
