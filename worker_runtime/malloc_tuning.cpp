#include "worker_runtime/malloc_tuning.h"

#include <malloc.h>

#include "base/errors.h"

namespace ddprun::runtime {

MallocTuning decideMallocTuning(const EnvLookup& env, const EnvLookup& glibcEnv) {
  if (const auto v = env(kMallocTuningVariable); v && !v->empty()) {
    if (*v == "0") return {.apply = false, .why = std::string(kMallocTuningVariable) + "=0"};
    if (*v != "1") {
      throw ConfigError(std::string(kMallocTuningVariable) + "='" + *v +
                        "' is not valid: expected 1 (keep freed memory for the next step, the "
                        "default) or 0 (glibc's own thresholds)");
    }
  }
  // glibc takes an empty value as 0: set all the same.
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"}) {
    if (glibcEnv(name)) return {.apply = false, .why = std::string(name) + " is set"};
  }
  if (const auto t = glibcEnv("GLIBC_TUNABLES"); t) {
    for (const char* name : {"glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold"}) {
      if (t->find(name) != std::string::npos) {
        return {.apply = false, .why = std::string("GLIBC_TUNABLES sets ") + name};
      }
    }
  }
  return {.apply = true, .why = {}};
}

bool applyMallocTuning() {
  // The mmap threshold first, and the trim threshold only once it is set: the first mallopt of
  // either that succeeds stops glibc from moving both, so a trim threshold set alone would freeze
  // the mmap threshold where it is (128 KiB in a young process): every large block mmap'd.
  if (::mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMallocMmapThreshold)) != 1 &&
      ::mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMallocMmapThresholdOldGlibc)) != 1) {
    return false;
  }
  return ::mallopt(M_TRIM_THRESHOLD, static_cast<int>(kMallocTrimThreshold)) == 1;
}

}  // namespace ddprun::runtime
