#include "worker_runtime/model_description.h"

#include <sstream>

namespace ddprun::runtime {

std::vector<std::string> describeModel(const torch::nn::Module& m) {
  std::vector<std::string> lines;
  auto line = [](const char* kind, const std::string& name, const torch::Tensor& t) {
    std::ostringstream os;
    os << kind << "|" << name << "|" << c10::toString(t.scalar_type()) << "|" << t.sizes();
    return os.str();
  };
  for (const auto& p : m.named_parameters()) lines.push_back(line("parameter", p.key(), p.value()));
  for (const auto& b : m.named_buffers()) lines.push_back(line("buffer", b.key(), b.value()));
  return lines;
}

int64_t textDigest(std::string_view text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return static_cast<int64_t>(h >> 1);
}

}  // namespace ddprun::runtime
