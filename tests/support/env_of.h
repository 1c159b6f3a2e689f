#pragma once
// An environment for InitOptions::env and the runtime's other lookups, from a map: tests give
// init() the variables a launcher would set without touching the process's own.
#include <map>
#include <optional>
#include <string>

#include "worker_runtime/env.h"

namespace ddprun::test {

inline runtime::EnvLookup envOf(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace ddprun::test
