#pragma once
// Running a helper command (scontrol) and reading what it prints, bounded in time.
#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::launcher::cluster {

// Runs argv[0] (looked up on PATH) with stdin and stderr on /dev/null and returns its stdout
// when it exits 0 within `timeout`; nullopt when it cannot start, fails, or takes longer (it
// is then killed). At most 1 MiB of output is kept.
std::optional<std::string> runCommand(const std::vector<std::string>& argv,
                                      std::chrono::milliseconds timeout);

}  // namespace ddprun::launcher::cluster
