// ddprun-bench SUBCOMMAND [OPTIONS]: benchmarks that measure ddprun against its peer
// (c10d::TCPStore, torchrun, raw Gloo, PyTorch DDP) in one run. `ddprun-bench` alone lists them.
#include <iostream>

#include "bench/registry.h"

namespace ddprun::bench {
std::map<std::string, BenchEntry>& registry() {
  static std::map<std::string, BenchEntry> r;
  return r;
}
}  // namespace ddprun::bench

int main(int argc, char** argv) {
  auto& r = ddprun::bench::registry();
  if (argc < 2 || r.find(argv[1]) == r.end()) {
    if (argc >= 2 && std::string(argv[1]) != "--help" && std::string(argv[1]) != "-h") {
      std::cerr << "ddprun-bench: unknown benchmark '" << argv[1] << "'\n";
    }
    std::cerr << "usage: ddprun-bench BENCHMARK [OPTIONS]   (BENCHMARK --help for its options)\n";
    for (const auto& [name, e] : r) std::cerr << "  " << name << "\t" << e.help << "\n";
    return argc < 2 ? 2 : (r.count(argv[1]) ? 0 : 2);
  }
  return r[argv[1]].fn(argc - 1, argv + 1);
}
