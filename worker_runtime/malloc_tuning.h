#pragma once
// Freed memory kept for the next step: glibc's malloc tuned for a training loop.
//
// A training step allocates and frees the same large temporaries every time: a weight's new
// gradient before autograd adds it to .grad (16 MiB for a 2048x2048 layer), activations, the
// optimizer's scratch. glibc gives a freed block back to the kernel when it was mmap'd (at or
// above M_MMAP_THRESHOLD) or lies at the heap's top beyond M_TRIM_THRESHOLD, and it moves both
// thresholds at run time (freeing an mmap'd block of up to 32 MiB raises them), so whether a
// process does so every step depends on the order its blocks happened to be freed. One that does
// faults every page of those blocks in again each step: 4,096 faults per 16 MiB, 11-20 us each on
// a guest with shadow page tables. Measured with `ddprun-bench allreduce` (784-2048x3-10 MLP, 2
// ranks): one rank took 4-12 thousand faults per 0.4 s while its peer took none, and the DDP step
// ran 1.4-1.8x the local step in such runs instead of 1.1x (docs/worker_runtime.md, "Freed memory
// kept").
//
// So init() fixes both thresholds, first thing, before the program's threads free large blocks
// (the spare template and its forks inherit them): blocks below 256 MiB come from the heap (32 MiB
// on glibc < 2.35, which refuses more), and the main heap gives memory back only when more than
// 1 GiB at its top is free. A process keeps its heap's high-water mark, as PyTorch's CUDA caching
// allocator keeps GPU memory. Limits: larger blocks are still mmap'd per allocation, and a thread
// arena's heaps (64 MiB each) are unmapped whole when they empty, whatever the trim threshold;
// LibTorch's CPU autograd runs on the calling thread, whose blocks are the main arena's.
//
// The environment has the last word: when the process's environment sets either threshold itself
// (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, even empty, or glibc.malloc.mmap_threshold /
// trim_threshold in GLIBC_TUNABLES: glibc read those at start-up), nothing is changed, and
// DDPRUN_MALLOC_TUNING=0 keeps glibc's own behaviour.
#include <cstddef>
#include <string>

#include "worker_runtime/env.h"

namespace ddprun::runtime {

inline constexpr size_t kMallocMmapThreshold = size_t{256} << 20;
inline constexpr size_t kMallocMmapThresholdOldGlibc = size_t{32} << 20;  // HEAP_MAX_SIZE / 2
inline constexpr size_t kMallocTrimThreshold = size_t{1} << 30;
inline constexpr const char* kMallocTuningVariable = "DDPRUN_MALLOC_TUNING";

struct MallocTuning {
  bool apply = false;
  std::string why;  // when not applied: what in the environment said so
};

// Pure: what init() does. DDPRUN_MALLOC_TUNING is read from `env` (init()'s lookup), glibc's own
// variables from `glibcEnv` (the process's environment, which glibc read). Throws ConfigError
// when DDPRUN_MALLOC_TUNING is set to anything but 0 or 1, naming the variable and the value.
MallocTuning decideMallocTuning(const EnvLookup& env, const EnvLookup& glibcEnv);

// Sets both thresholds (mallopt). Returns false when the allocator refused them (glibc never
// does for these values; an interposed one, such as a sanitizer's, may); then neither is set.
bool applyMallocTuning();

}  // namespace ddprun::runtime
