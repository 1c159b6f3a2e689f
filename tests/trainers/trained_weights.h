#pragma once
// The final weights of a bundled mnist_mlp run (hidden 512), read back from the file the trainer
// saved, and their bit-for-bit comparison: what the end-to-end elastic and recovery tests check
// against an uninterrupted run.
#include "tests/support/catch_torch.h"

#include <filesystem>
#include <string>
#include <vector>

#include "trainers/models.h"

namespace ddprun::trainers::testing {

inline std::vector<torch::Tensor> loadWeights(const std::string& path) {
  REQUIRE(std::filesystem::exists(path));
  auto model = makeModel("mlp", 512, 0);
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  model->load(archive);
  return model->parameters();
}

inline bool bitIdentical(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

}  // namespace ddprun::trainers::testing
