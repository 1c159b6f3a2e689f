// runtime_sampler_dump: reads lines "N REPLICAS SEED EPOCH SHUFFLE DROP_LAST" from stdin and, for
// each, prints every rank's indices (one rank per line) followed by a line "end", for
// sampler_vs_torch.py to compare with torch's DistributedSampler.
#include <iostream>
#include <sstream>
#include <string>

#include "worker_runtime/sampler.h"

int main() {
  using namespace ddprun::runtime;
  for (std::string line; std::getline(std::cin, line);) {
    std::istringstream in(line);
    size_t n;
    int replicas, shuffle, dropLast;
    uint64_t seed;
    int64_t epoch;
    if (!(in >> n >> replicas >> seed >> epoch >> shuffle >> dropLast)) {
      std::cerr << "runtime_sampler_dump: bad line '" << line << "'\n";
      return 2;
    }
    DistributedSamplerOptions o{.datasetSize = n, .numReplicas = replicas, .shuffle = shuffle == 1,
                                .seed = seed, .dropLast = dropLast == 1};
    for (int r = 0; r < replicas; ++r) {
      o.rank = r;
      DistributedSampler s(o);
      s.setEpoch(epoch);
      for (size_t i = 0; i < s.indices().size(); ++i) std::cout << (i ? " " : "") << s.indices()[i];
      std::cout << "\n";
    }
    std::cout << "end\n";
  }
  return 0;
}
