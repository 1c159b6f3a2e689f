#include "worker_runtime/reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "base/errors.h"

namespace ddprun::runtime {
namespace {

// float16 and bfloat16 are reduced in float and rounded back once per pair, like Gloo does.
template <typename T>
struct Acc {
  using type = T;
};
template <>
struct Acc<c10::Half> {
  using type = float;
};
template <>
struct Acc<c10::BFloat16> {
  using type = float;
};

// Below this, memcpy was as fast or faster in ddprun-bench allreduce (2 ranks, A/B in one run:
// 4 KiB 4.6 vs 3.4 us, 16 KiB 9.0 vs 8.4 us; 64 KiB 19.1 vs 21.9 us, 256 KiB 92 vs 153 us):
// a streamed line must go out to memory before the fence lets the flag go, and the peer then
// reads it from there, which costs more than the round trips of a few dozen lines.
constexpr size_t kStreamMinBytes = 32u << 10;

#if defined(__x86_64__)
constexpr bool kCanStream = true;
// Copies with non-temporal stores for whole cache lines of dst (SSE2, in every x86-64; the
// write-combining buffers merge the four 16-byte stores of a line), memcpy for the part before
// the first line boundary and the rest. Weakly ordered: streamFence() before publishing.
void streamLines(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  const size_t head = std::min(bytes, (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  for (size_t i = 0; i < bytes / 64; ++i, d += 64, s += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  std::memcpy(d, s, bytes % 64);
}
void streamFence() { _mm_sfence(); }
#else
constexpr bool kCanStream = false;
void streamLines(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void streamFence() {}
#endif

// The op is a template parameter of the inner loop so that the compiler vectorizes it.
template <typename T, typename F>
void binaryLoop(T* dst, const T* src, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) dst[i] = f(dst[i], src[i]);
}

template <typename T>
void reduceIntoT(T* dst, const T* src, size_t n, ReduceOp op) {
  using A = typename Acc<T>::type;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      binaryLoop(dst, src, n, [](T a, T b) { return T(A(a) + A(b)); });
      return;
    case ReduceOp::Min:
      binaryLoop(dst, src, n, [](T a, T b) { return T(std::min(A(a), A(b))); });
      return;
    case ReduceOp::Max:
      binaryLoop(dst, src, n, [](T a, T b) { return T(std::max(A(a), A(b))); });
      return;
  }
}

template <typename T>
void divideT(T* dst, size_t n, int divisor) {
  using A = typename Acc<T>::type;
  const A d = static_cast<A>(divisor);
  for (size_t i = 0; i < n; ++i) dst[i] = T(A(dst[i]) / d);
}

template <typename T>
void reduceManyToT(void* const* out, int outs, const void* const* in, int k, size_t n,
                   ReduceOp op, int divisor, int streamFrom) {
  // Blocks of a local accumulator (in L1) keep the loops vectorizable despite outputs aliasing
  // inputs, and let one pass over memory do the reduction, the division and every store.
  constexpr size_t kBlock = 8192 / sizeof(T) > 256 ? 8192 / sizeof(T) : 256;
  T acc[kBlock];
  // Decided for the whole call (streamCopy's threshold), not block by block.
  const bool stream = kCanStream && streamFrom >= 0 && n * sizeof(T) >= kStreamMinBytes;
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t m = std::min(kBlock, n - base);
    std::copy_n(static_cast<const T*>(in[0]) + base, m, acc);
    for (int j = 1; j < k; ++j) reduceIntoT(acc, static_cast<const T*>(in[j]) + base, m, op);
    if (divisor > 1) divideT(acc, m, divisor);
    for (int o = 0; o < outs; ++o) {
      if (stream && o >= streamFrom) {
        streamLines(static_cast<T*>(out[o]) + base, acc, m * sizeof(T));
      } else {
        std::copy_n(acc, m, static_cast<T*>(out[o]) + base);
      }
    }
  }
  if (stream) streamFence();
}

// Calls fn(T{}) with T the C++ type of `type`.
template <typename Fn>
void dispatch(c10::ScalarType type, Fn&& fn) {
  switch (type) {
    case c10::ScalarType::Float: return fn(float{});
    case c10::ScalarType::Double: return fn(double{});
    case c10::ScalarType::Half: return fn(c10::Half{});
    case c10::ScalarType::BFloat16: return fn(c10::BFloat16{});
    case c10::ScalarType::Int: return fn(int32_t{});
    case c10::ScalarType::Long: return fn(int64_t{});
    case c10::ScalarType::Char: return fn(int8_t{});
    case c10::ScalarType::Byte: return fn(uint8_t{});
    default: break;
  }
  DDPRUN_CHECK(false, "unsupported dtype " << c10::toString(type));
}

}  // namespace

bool supportedDtype(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float:
    case c10::ScalarType::Double:
    case c10::ScalarType::Half:
    case c10::ScalarType::BFloat16:
    case c10::ScalarType::Int:
    case c10::ScalarType::Long:
    case c10::ScalarType::Char:
    case c10::ScalarType::Byte:
      return true;
    default:
      return false;
  }
}

void reduceInto(void* dst, const void* src, size_t n, c10::ScalarType type, ReduceOp op) {
  dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    reduceIntoT(static_cast<T*>(dst), static_cast<const T*>(src), n, op);
  });
}

void reduceMany(void* dst, const void* const* in, int k, size_t n, c10::ScalarType type,
                ReduceOp op) {
  void* const out[1] = {dst};
  reduceManyTo(out, 1, in, k, n, type, op, 1);
}

void reduceManyTo(void* const* out, int outs, const void* const* in, int k, size_t n,
                  c10::ScalarType type, ReduceOp op, int divisor, int streamFrom) {
  dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    reduceManyToT<T>(out, outs, in, k, n, op, divisor, streamFrom);
  });
}

void streamCopy(void* dst, const void* src, size_t bytes) {
  if (kCanStream && bytes >= kStreamMinBytes) {
    streamLines(dst, src, bytes);
    streamFence();
    return;
  }
  std::memcpy(dst, src, bytes);
}

void divideBy(void* dst, size_t n, c10::ScalarType type, int divisor) {
  dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    divideT(static_cast<T*>(dst), n, divisor);
  });
}

}  // namespace ddprun::runtime
