#include "worker_runtime/thread_pools.h"

#include <dlfcn.h>

#include <cstdlib>

#include <ATen/Parallel.h>

namespace ddprun::runtime {
namespace {

int positiveEnv(const char* name) {
  const char* v = std::getenv(name);
  const int n = v ? std::atoi(v) : 0;
  return n > 0 ? n : 0;
}

// OpenBLAS's controls, when the program has OpenBLAS: looked up once per process.
struct BlasControls {
  void (*setThreads)(int) = nullptr;
  int procs = 0;  // its CPU count (the machine's: the same in every fork)
};

const BlasControls& blasControls() {
  static const BlasControls controls = [] {
    BlasControls c;
    using GetInt = int (*)();
    c.setThreads = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
    auto procs = reinterpret_cast<GetInt>(dlsym(RTLD_DEFAULT, "openblas_get_num_procs"));
    if (c.setThreads == nullptr || procs == nullptr) return BlasControls{};
    c.procs = procs();
    return c;
  }();
  return controls;
}

}  // namespace

void resolveThreadPoolControls() { (void)blasControls(); }

std::string matchThreadPools() {
  const int torchThreads = at::intraop_default_num_threads();
  at::set_num_threads(torchThreads);
  std::string line = "LibTorch " + std::to_string(torchThreads) + " thread" +
                     (torchThreads == 1 ? "" : "s");
  const BlasControls& blas = blasControls();
  if (blas.setThreads == nullptr) return line;
  int threads = positiveEnv("OPENBLAS_NUM_THREADS");
  if (threads == 0) threads = positiveEnv("GOTO_NUM_THREADS");
  if (threads == 0) threads = positiveEnv("OMP_NUM_THREADS");
  if (threads == 0) threads = blas.procs;
  if (threads < 1) threads = 1;
  blas.setThreads(threads);
  return line + ", OpenBLAS " + std::to_string(threads);
}

void oneThreadPerPool() { at::set_num_threads(1); }

}  // namespace ddprun::runtime
