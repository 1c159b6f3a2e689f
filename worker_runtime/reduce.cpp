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
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t m = std::min(kBlock, n - base);
    std::copy_n(static_cast<const T*>(in[0]) + base, m, acc);
    for (int j = 1; j < k; ++j) reduceIntoT(acc, static_cast<const T*>(in[j]) + base, m, op);
    if (divisor > 1) divideT(acc, m, divisor);
    for (int o = 0; o < outs; ++o) {
      if (streamFrom >= 0 && o >= streamFrom) {
        streamCopy(static_cast<T*>(out[o]) + base, acc, m * sizeof(T));
      } else {
        std::copy_n(acc, m, static_cast<T*>(out[o]) + base);
      }
    }
  }
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
#if defined(__x86_64__)
  if (bytes >= 1024) {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    // The part before the first cache line boundary of dst, then whole lines (SSE2: in every
    // x86-64; the write-combining buffers merge the four 16-byte stores of a line), the rest.
    const size_t head = (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64;
    std::memcpy(d, s, head);
    d += head;
    s += head;
    bytes -= head;
    const size_t lines = bytes / 64;
    for (size_t i = 0; i < lines; ++i, d += 64, s += 64) {
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
    _mm_sfence();  // the streamed stores are weakly ordered: before whatever publishes them
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

void divideBy(void* dst, size_t n, c10::ScalarType type, int divisor) {
  dispatch(type, [&](auto tag) {
    using T = decltype(tag);
    divideT(static_cast<T*>(dst), n, divisor);
  });
}

}  // namespace ddprun::runtime
