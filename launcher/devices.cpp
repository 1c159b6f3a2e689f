#include "launcher/devices.h"

#include <dlfcn.h>
#include <unistd.h>

namespace ddprun::launcher {

int cpuCount() {
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

int cudaDeviceCount() {
  // The driver API's two entry points we need; CUresult 0 is CUDA_SUCCESS.
  using CuInit = int (*)(unsigned int);
  using CuDeviceGetCount = int (*)(int*);
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return 0;
  auto init = reinterpret_cast<CuInit>(dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<CuDeviceGetCount>(dlsym(lib, "cuDeviceGetCount"));
  int n = 0;
  if (init == nullptr || count == nullptr || init(0) != 0 || count(&n) != 0) n = 0;
  dlclose(lib);
  return n;
}

}  // namespace ddprun::launcher
