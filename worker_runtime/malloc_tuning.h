#pragma once
// Freed memory kept for the next step: glibc's malloc tuned for a training loop.
//
// A training step allocates and frees the same large temporaries every time: a weight's new
// gradient before autograd adds it to .grad (16 MiB for a 2048x2048 layer), activations, the
// optimizer's scratch. glibc gives a freed block back to the kernel when it was mmap'd (above
// M_MMAP_THRESHOLD) or lies at the heap's top beyond M_TRIM_THRESHOLD, and both thresholds move
// at run time (a freed mmap'd block raises them), so whether a process does it every step depends
// on the order its blocks happened to be freed. One that does faults every page of those blocks
// in again each step: 4,096 faults per 16 MiB, 11-20 us each on a guest with shadow page tables.
// Measured with `ddprun-bench allreduce` (784-2048x3-10 MLP, 2 ranks): one rank took 4-12
// thousand faults per 0.4 s while its peer took none, and the DDP step ran 1.6-1.8x the local
// step in such runs instead of 1.1x (docs/worker_runtime.md, "Freed memory kept").
//
// So init() fixes both thresholds, first thing (the spare template and its forks inherit them):
// blocks up to 32 MiB (glibc's largest mmap threshold) come from the heap, and the heap gives
// memory back only when more than 1 GiB at its top is free. A process keeps the high-water mark
// of its heap, as PyTorch's CUDA caching allocator does on a GPU. Blocks above 32 MiB are still
// mmap'd per allocation (glibc cannot do otherwise; an allocator such as jemalloc can).
//
// The environment has the last word: when it sets either threshold itself (MALLOC_MMAP_THRESHOLD_,
// MALLOC_TRIM_THRESHOLD_, or glibc.malloc.mmap_threshold / trim_threshold in GLIBC_TUNABLES),
// nothing is changed, and DDPRUN_MALLOC_TUNING=0 keeps glibc's own behaviour.
#include <cstddef>
#include <string>

#include "worker_runtime/env.h"

namespace ddprun::runtime {

inline constexpr size_t kMallocMmapThreshold = size_t{32} << 20;
inline constexpr size_t kMallocTrimThreshold = size_t{1} << 30;
inline constexpr const char* kMallocTuningVariable = "DDPRUN_MALLOC_TUNING";

struct MallocTuning {
  bool apply = false;
  std::string why;  // when not applied: what in the environment said so
};

// Pure: what init() does, from the environment. Throws ConfigError when DDPRUN_MALLOC_TUNING is
// set to anything but 0 or 1, naming the variable and the value.
MallocTuning decideMallocTuning(const EnvLookup& env);

// Sets both thresholds (mallopt). Returns false when glibc refused one of them.
bool applyMallocTuning();

}  // namespace ddprun::runtime
