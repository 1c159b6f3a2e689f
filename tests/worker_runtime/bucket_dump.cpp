// runtime_bucket_dump: reads lines "DTYPE:BYTES DTYPE:BYTES ..." (one model's parameters in
// registration order; DTYPE is f32, f64, f16 or i64) from stdin and, for each, prints the
// buckets of ddprun::runtime::assignBuckets with the default caps (1 MiB first, 25 MiB after)
// as one line: buckets separated by "|", parameter indices by spaces, in launch order. For
// buckets_vs_torch.py to compare with PyTorch's own assignment.
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include "worker_runtime/ddp.h"

int main() {
  using namespace ddprun::runtime;
  const std::map<std::string, torch::Dtype> kTypes{
      {"f32", torch::kFloat}, {"f64", torch::kDouble}, {"f16", torch::kHalf}, {"i64", torch::kLong}};
  for (std::string line; std::getline(std::cin, line);) {
    std::istringstream in(line);
    std::vector<size_t> bytes;
    std::vector<torch::Dtype> types;
    for (std::string item; in >> item;) {
      const auto colon = item.find(':');
      const auto type = colon == std::string::npos ? kTypes.end() : kTypes.find(item.substr(0, colon));
      if (type == kTypes.end()) {
        std::cerr << "runtime_bucket_dump: bad item '" << item << "' (want DTYPE:BYTES)\n";
        return 2;
      }
      types.push_back(type->second);
      bytes.push_back(std::stoull(item.substr(colon + 1)));
    }
    const auto buckets = assignBuckets(bytes, types, DdpOptions{});
    for (size_t b = 0; b < buckets.size(); ++b) {
      if (b) std::cout << "|";
      for (size_t i = 0; i < buckets[b].params.size(); ++i)
        std::cout << (i ? " " : "") << buckets[b].params[i];
    }
    std::cout << "\n";
  }
  return 0;
}
