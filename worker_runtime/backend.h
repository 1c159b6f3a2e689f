#pragma once
// Backend choice: DDPRUN_BACKEND=auto|nccl|gloo.
//
// auto picks NCCL when ddprun was built with NCCL and a GPU is visible, otherwise Gloo; init()
// logs the choice and its reason in one line. Asking for nccl where it cannot work (built without
// NCCL, or no GPU visible) is a ConfigError that says why, rather than a silent fallback.
#include <string>
#include <string_view>

namespace ddprun::runtime {

enum class Backend : uint8_t { Auto, Gloo, Nccl };

std::string_view toString(Backend b);

// Parses "auto", "gloo" or "nccl" (case-insensitive). `source` names where the value came from
// (e.g. "DDPRUN_BACKEND") in the ConfigError for anything else.
Backend parseBackend(std::string_view value, std::string_view source = "DDPRUN_BACKEND");

struct BackendChoice {
  Backend backend = Backend::Gloo;  // never Auto
  std::string reason;               // one line, e.g. "auto: no GPU visible"
};

// Pure decision, testable without a GPU. `ncclBuilt`: compiled with NCCL; `visibleGpus`: CUDA
// devices this process can use. Throws ConfigError when `requested` is Nccl and impossible.
BackendChoice chooseBackend(Backend requested, bool ncclBuilt, int visibleGpus);

}  // namespace ddprun::runtime
