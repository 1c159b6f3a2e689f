#include "worker_runtime/malloc_tuning.h"

#include <malloc.h>

#include "base/errors.h"

namespace ddprun::runtime {

MallocTuning decideMallocTuning(const EnvLookup& env) {
  if (const auto v = env(kMallocTuningVariable); v && !v->empty()) {
    if (*v == "0") return {.apply = false, .why = std::string(kMallocTuningVariable) + "=0"};
    if (*v != "1") {
      throw ConfigError(std::string(kMallocTuningVariable) + "='" + *v +
                        "' is not valid: expected 1 (keep freed memory for the next step, the "
                        "default) or 0 (glibc's own thresholds)");
    }
  }
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"}) {
    if (const auto v = env(name); v && !v->empty()) {
      return {.apply = false, .why = std::string(name) + " is set"};
    }
  }
  if (const auto t = env("GLIBC_TUNABLES"); t) {
    for (const char* name : {"glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold"}) {
      if (t->find(name) != std::string::npos) {
        return {.apply = false, .why = std::string("GLIBC_TUNABLES sets ") + name};
      }
    }
  }
  return {.apply = true, .why = {}};
}

bool applyMallocTuning() {
  // Order matters little, but each call that changes a threshold also stops glibc from moving
  // either of them later (its dynamic adjustment), which is the point.
  const bool mmapOk = ::mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMallocMmapThreshold)) == 1;
  const bool trimOk = ::mallopt(M_TRIM_THRESHOLD, static_cast<int>(kMallocTrimThreshold)) == 1;
  return mmapOk && trimOk;
}

}  // namespace ddprun::runtime
