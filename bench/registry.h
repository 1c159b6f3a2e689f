#pragma once
// ddprun-bench subcommands register themselves here; main() dispatches on argv[1].
// Each benchmark runs ddprun and its peer in the same run and reports the ratio, because
// absolute times on shared machines drift.
//
//   static int benchStore(int argc, char** argv);
//   DDPRUN_BENCH("store", "ddprun-store vs c10d::TCPStore", benchStore)
#include <map>
#include <string>

namespace ddprun::bench {

using BenchMain = int (*)(int argc, char** argv);

struct BenchEntry {
  std::string help;
  BenchMain fn;
};

std::map<std::string, BenchEntry>& registry();

struct Registration {
  Registration(const char* name, const char* help, BenchMain fn) {
    registry()[name] = BenchEntry{help, fn};
  }
};

}  // namespace ddprun::bench

#define DDPRUN_BENCH(NAME, HELP, FN) \
  static ::ddprun::bench::Registration ddprun_bench_registration_##FN(NAME, HELP, FN);
