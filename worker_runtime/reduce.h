#pragma once
// Element-wise reduction kernels over raw buffers, for the allreduce algorithms.
//
// The result of a reduction must be bit-identical on every rank, so every kernel here is a plain
// loop with a fixed evaluation order (no threading, no reassociation): given the same inputs in
// the same order, every rank computes the same bits. The loops are written for the compiler to
// vectorize (reduce.cpp is built with -O3: at -O2 GCC 12 vectorizes none of them); vector
// instructions do the same IEEE operation per element, so this changes no bit.
#include <cstddef>
#include <cstdint>

#include <c10/core/ScalarType.h>

#include "worker_runtime/communicator.h"

namespace ddprun::runtime {

// The element types the communicators support (see communicator.h).
bool supportedDtype(c10::ScalarType t);

// dst[i] = dst[i] (op) src[i] for i < n. op is Sum, Min or Max (Avg reduces as Sum).
void reduceInto(void* dst, const void* src, size_t n, c10::ScalarType type, ReduceOp op);

// dst[i] = in[0][i] (op) in[1][i] (op) ... (op) in[k-1][i], evaluated left to right. dst may
// alias any input.
void reduceMany(void* dst, const void* const* in, int k, size_t n, c10::ScalarType type,
                ReduceOp op);

// reduceMany, then (divisor > 1) each result divided by divisor as divideBy does, stored into
// every out[0..outs-1]: one pass over memory for the reduction, ReduceOp::Avg's division and
// the copies to peers. Outputs may alias inputs at the same index (each block of elements is
// read from every input before it is stored); they must not overlap each other. Outputs from
// index `streamFrom` on are stored with streamCopy (memory another core reads next); -1: none.
void reduceManyTo(void* const* out, int outs, const void* const* in, int k, size_t n,
                  c10::ScalarType type, ReduceOp op, int divisor, int streamFrom = -1);

// memcpy for memory that another core reads next (shared-memory slots): whole cache lines are
// written with non-temporal stores, which neither fetch the lines first nor keep them here.
// Storing into lines a peer holds in its cache (it read them the round before) otherwise costs
// a round trip to that core per line: on a 2-vCPU EPYC VM a plain 64 KiB copy into a slot took
// 18 us, streamed 4 us. Ends with a store fence, so a release store after it publishes the bytes.
// Copies under 32 KiB (where memcpy measured as fast; reduce.cpp), and CPUs without such stores,
// use memcpy.
void streamCopy(void* dst, const void* src, size_t bytes);

// dst[i] /= divisor (floating types only): the last step of ReduceOp::Avg.
void divideBy(void* dst, size_t n, c10::ScalarType type, int divisor);

}  // namespace ddprun::runtime
