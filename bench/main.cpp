// ddprun-bench SUBCOMMAND [OPTIONS]: benchmarks that measure ddprun against its peer
// (c10d::TCPStore, torchrun, raw Gloo, PyTorch DDP) in one run. `ddprun-bench` alone lists them.
#include <iostream>
#include <string>

#include "bench/registry.h"

namespace ddprun::bench {
std::map<std::string, BenchEntry>& registry() {
  static std::map<std::string, BenchEntry> r;
  return r;
}
}  // namespace ddprun::bench

int main(int argc, char** argv) {
  auto& r = ddprun::bench::registry();
  const std::string first = argc >= 2 ? argv[1] : "";
  if (first == "--help" || first == "-h" || first == "--version") {
    // Asked for: on stdout, exit 0 (help2man builds the man page from these).
    if (first == "--version") {
      std::cout << "ddprun-bench " << DDPRUN_VERSION << "\n";
      return 0;
    }
    std::cout << "usage: ddprun-bench BENCHMARK [OPTIONS]   (BENCHMARK --help for its options)\n"
                 "Measures ddprun against its peer in the same run and reports the ratio.\n\n"
                 "Benchmarks:\n";
    for (const auto& [name, e] : r) std::cout << "  " << name << "\t" << e.help << "\n";
    return 0;
  }
  if (argc < 2 || r.find(first) == r.end()) {
    if (argc >= 2) std::cerr << "ddprun-bench: unknown benchmark '" << first << "'\n";
    std::cerr << "usage: ddprun-bench BENCHMARK [OPTIONS]   (BENCHMARK --help for its options)\n";
    for (const auto& [name, e] : r) std::cerr << "  " << name << "\t" << e.help << "\n";
    return 2;
  }
  try {
    return r[first].fn(argc - 1, argv + 1);
  } catch (const std::exception& e) {  // a benchmark that cannot go on (e.g. a process not started)
    std::cerr << "ddprun-bench " << first << ": " << e.what() << "\n";
    return 1;
  }
}
