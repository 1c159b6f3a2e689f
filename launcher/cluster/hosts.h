#pragma once
// The hosts of an ssh launch, as Horovod (`-H h1:2,h2:2`), DeepSpeed and Open MPI (hostfile
// lines `host slots=N`) write them. Pure parsers; each error names the input and the part.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::launcher::cluster {

struct HostSlots {
  std::string host;          // an ssh destination: name, address, user@name, [IPv6]
  std::optional<int> slots;  // workers on it; unset: --nproc-per-node
};

// --hosts: HOST[:SLOTS] separated by commas ("h1:2,h2:2", "user@h1,h2", "[fd00::1]:4").
std::vector<HostSlots> parseHosts(std::string_view list);

// A hostfile: one host a line, optionally "slots=N" after it ("max_slots=N" is accepted and
// ignored, as DeepSpeed does); '#' starts a comment; blank lines are skipped. `name` (the
// file's path) appears in errors with the line number.
std::vector<HostSlots> parseHostfile(std::string_view text, const std::string& name);
// Reads and parses the file; ConfigError when it cannot be read.
std::vector<HostSlots> readHostfile(const std::string& path);

// The host part of an ssh destination: "user@h1" -> "h1", "[fd00::1]" -> "fd00::1".
std::string hostAddress(const std::string& destination);

}  // namespace ddprun::launcher::cluster
