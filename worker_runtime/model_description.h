#pragma once
// A model's structure as text, and a digest of text: how ranks check that they hold the same
// model without sending it to each other (DistributedDataParallel's model check, the elastic
// heal's check of the registered state). The text names every parameter and buffer with its
// dtype and shape, never its values.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <torch/torch.h>

namespace ddprun::runtime {

// One line per parameter, then per buffer, in registration order:
// "parameter|fc1.weight|Float|[512, 784]".
std::vector<std::string> describeModel(const torch::nn::Module& m);

// 64-bit FNV-1a of `text`, shifted right by one so that it is a non-negative int64 (it travels
// as a tensor element). Equal text gives an equal digest on every rank and every run.
int64_t textDigest(std::string_view text);

}  // namespace ddprun::runtime
