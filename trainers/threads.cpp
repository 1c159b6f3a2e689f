#include "trainers/threads.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include <torch/torch.h>

namespace ddprun::trainers {
namespace {

// The file that provides sgemm_ to the process -- the BLAS LibTorch's matrix products call.
std::string sgemmLibrary() {
  void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_");
  Dl_info info{};
  if (!sgemm || !dladdr(sgemm, &info) || !info.dli_fname) return "";
  std::error_code ec;
  auto real = std::filesystem::canonical(info.dli_fname, ec);
  return ec ? std::string(info.dli_fname) : real.string();
}

}  // namespace

ThreadSetup configureThreads(int localWorldSize) {
  ThreadSetup setup;
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const int fromEnv = omp ? std::atoi(omp) : 0;
  if (fromEnv > 0) {
    setup.threads = fromEnv;
  } else {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    setup.threads = std::max(1, cores / std::max(1, localWorldSize));
  }
  torch::set_num_threads(setup.threads);

  const std::string library = sgemmLibrary();
  using SetThreads = void (*)(int);
  using GetConfig = char* (*)();
  auto setBlasThreads =
      reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  auto getConfig = reinterpret_cast<GetConfig>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
  if (setBlasThreads) setBlasThreads(1);
  if (library.find("openblas") != std::string::npos) {
    setup.openblas = true;
    setup.blas = std::string(getConfig ? getConfig() : "OpenBLAS") + " (1 thread; LibTorch " +
                 std::to_string(setup.threads) + "), " + library;
  } else {
    setup.blas = (library.empty() ? std::string("unknown") : library) +
                 ": not OpenBLAS, matrix products are about 4x slower "
                 "(install libopenblas0-pthread)";
  }
  return setup;
}

}  // namespace ddprun::trainers
