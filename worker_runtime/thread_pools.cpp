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

}  // namespace

std::string matchThreadPools() {
  const int torchThreads = at::intraop_default_num_threads();
  at::set_num_threads(torchThreads);
  std::string line = "LibTorch " + std::to_string(torchThreads) + " thread" +
                     (torchThreads == 1 ? "" : "s");
  using SetThreads = void (*)(int);
  using GetInt = int (*)();
  auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  auto procs = reinterpret_cast<GetInt>(dlsym(RTLD_DEFAULT, "openblas_get_num_procs"));
  if (set == nullptr || procs == nullptr) return line;
  int blas = positiveEnv("OPENBLAS_NUM_THREADS");
  if (blas == 0) blas = positiveEnv("GOTO_NUM_THREADS");
  if (blas == 0) blas = positiveEnv("OMP_NUM_THREADS");
  if (blas == 0) blas = procs();
  if (blas < 1) blas = 1;
  set(blas);
  return line + ", OpenBLAS " + std::to_string(blas);
}

void oneThreadPerPool() { at::set_num_threads(1); }

}  // namespace ddprun::runtime
