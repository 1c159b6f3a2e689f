#pragma once
// The CPU thread pools of a spare forked from the spare template (docs/recovery.md#spare-template).
//
// The template must have one thread when it forks, but OpenBLAS starts its pool when the library
// loads (before main) with as many threads as OPENBLAS_NUM_THREADS, OMP_NUM_THREADS or the CPUs
// say, and LibTorch's OpenMP pool sizes itself from OMP_NUM_THREADS. So ddprun starts the template
// with OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1 (launcher/agent_spare_template.cpp), whatever
// the ranks get: at --nproc-per-node=1 a rank has no OMP_NUM_THREADS (torchrun's rule) and its
// pools are the machine's. A fork keeps the template's pools, not its own environment's, so a
// spare that takes a rank would compute with other thread counts than the rank it stands in for
// (slower, and a reduction split over fewer threads may round differently). matchThreadPools()
// sizes them as a process exec'd with this environment would have: LibTorch's intra-op threads
// by its own rule (at::intraop_default_num_threads(), read now), OpenBLAS's (looked up at run
// time: the program may use another BLAS) from OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS,
// OMP_NUM_THREADS or its CPU count, in that order. A program that sets its own counts after
// init() (the bundled trainers do) still has the last word.
#include <string>

namespace ddprun::runtime {

// Called in a forked spare once its environment is the spare's; starts OpenBLAS's threads if
// it needs more than one. Returns one line for the log ("LibTorch 2 threads, OpenBLAS 2").
std::string matchThreadPools();

// Looks up OpenBLAS's controls (and its CPU count), once per process, for matchThreadPools().
// The lookup is a dlsym() over every library the program loaded: 4-8 ms in a forked spare, whose
// page tables have none of those libraries' symbol tables yet, on the path of a grow back. The
// spare template calls this before its first fork, so that every spare inherits the answer.
void resolveThreadPoolControls();

// A template forked from a rank (spare/spare_template.h) keeps the rank's pool sizes: LibTorch's back
// to one thread, as an exec'd template's environment sets it, so its warm-up starts no thread.
// (OpenBLAS starts its pool as it loads: a rank with more than one thread forks no template.)
void oneThreadPerPool();

}  // namespace ddprun::runtime
