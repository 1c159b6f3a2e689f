#pragma once
// CPU threads for a worker: LibTorch's intra-op pool and OpenBLAS's own pool.
//
// With several workers on one machine, each must use its share of the cores or they fight over
// them. The count is OMP_NUM_THREADS when set (ddprun and torchrun set 1 when nproc > 1), else
// the cores divided by the local worker count. LibTorch's set_num_threads does not reach
// OpenBLAS's pthread pool, so that is set too (through openblas_set_num_threads, looked up at
// run time: the BLAS is whatever libblas.so.3 resolves to).
#include <string>

namespace ddprun::trainers {

struct ThreadSetup {
  int threads = 1;
  bool openblas = false;  // sgemm_ comes from OpenBLAS
  std::string blas;       // one line for the log: which BLAS, its threads, its file
};

ThreadSetup configureThreads(int localWorldSize);

}  // namespace ddprun::trainers
