#pragma once
// CPU threads for a worker: LibTorch's intra-op pool and OpenBLAS's own pool.
//
// With several workers on one machine, each must use its share of the cores or they fight over
// them. LibTorch gets OMP_NUM_THREADS threads when that is set (ddprun and torchrun set 1 when
// nproc > 1), else the cores divided by the local worker count. OpenBLAS, which LibTorch's
// set_num_threads does not reach, is held to one thread (through openblas_set_num_threads,
// looked up at run time): its pthread pool and LibTorch's OpenMP pool both spin while waiting,
// and with both at 2 threads on 2 cores an MLP step was measured 3-30x slower than with either
// at 1 (worse when the machine has other load).
#include <string>

namespace ddprun::trainers {

struct ThreadSetup {
  int threads = 1;
  bool openblas = false;  // sgemm_ comes from OpenBLAS
  std::string blas;       // one line for the log: which BLAS, its threads, its file
};

ThreadSetup configureThreads(int localWorldSize);

}  // namespace ddprun::trainers
