#pragma once
// Names in /dev/shm for the shared-memory tests: a prefix unique to this process and moment
// (ShmOptions::namePrefix), and how many names with it are left, which must be none once the
// ranks mapped their memory or failed (worker_runtime/shm/mapping.h).
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>

namespace ddprun::runtime::test {

inline std::string uniqueShmPrefix(const std::string& tag) {
  return "ddprun-" + tag + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
}

inline int shmLeftovers(const std::string& prefix) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) ++n;
  }
  return n;
}

}  // namespace ddprun::runtime::test
