#include "worker_runtime/backend.h"

#include <algorithm>
#include <cctype>

#include "base/errors.h"

namespace ddprun::runtime {

std::string_view toString(Backend b) {
  switch (b) {
    case Backend::Auto: return "auto";
    case Backend::Gloo: return "gloo";
    case Backend::Nccl: return "nccl";
  }
  return "?";
}

Backend parseBackend(std::string_view value, std::string_view source) {
  std::string v(value);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "auto") return Backend::Auto;
  if (v == "gloo") return Backend::Gloo;
  if (v == "nccl") return Backend::Nccl;
  throw ConfigError(std::string(source) + "='" + std::string(value) +
                    "' is not a backend: expected auto, nccl or gloo");
}

BackendChoice chooseBackend(Backend requested, bool ncclBuilt, int visibleGpus) {
  switch (requested) {
    case Backend::Gloo:
      return {Backend::Gloo, "gloo requested"};
    case Backend::Nccl:
      if (!ncclBuilt) {
        throw ConfigError(
            "backend nccl was requested but this ddprun was built without CUDA/NCCL: use "
            "DDPRUN_BACKEND=gloo or auto, or rebuild with CUDA and NCCL installed");
      }
      if (visibleGpus < 1) {
        throw ConfigError(
            "backend nccl was requested but no GPU is visible to this process (no CUDA device or "
            "driver, or CUDA_VISIBLE_DEVICES is empty): use DDPRUN_BACKEND=gloo or auto");
      }
      return {Backend::Nccl, "nccl requested"};
    case Backend::Auto:
      if (!ncclBuilt) return {Backend::Gloo, "auto: built without NCCL"};
      if (visibleGpus < 1) return {Backend::Gloo, "auto: NCCL built, but no GPU visible"};
      return {Backend::Nccl, "auto: " + std::to_string(visibleGpus) + " GPU(s) visible"};
  }
  return {Backend::Gloo, "?"};
}

}  // namespace ddprun::runtime
