#include "trainers/models.h"

#include "base/errors.h"

namespace ddprun::trainers {

namespace F = torch::nn::functional;

Mlp::Mlp(int64_t hidden)
    : fc1_(register_module("fc1", torch::nn::Linear(784, hidden))),
      fc2_(register_module("fc2", torch::nn::Linear(hidden, 10))) {}

torch::Tensor Mlp::forward(torch::Tensor pixels) {
  return fc2_(torch::relu(fc1_(pixels)));
}

ResidualBlockImpl::ResidualBlockImpl(int64_t channels)
    : conv1_(register_module(
          "conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, channels, 3).padding(1)))),
      conv2_(register_module(
          "conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, channels, 3).padding(1)))) {}

torch::Tensor ResidualBlockImpl::forward(torch::Tensor x) {
  return torch::relu(x + conv2_(torch::relu(conv1_(x))));
}

ResidualCnn::ResidualCnn(int64_t width)
    : stem_(register_module("stem",
                            torch::nn::Conv2d(torch::nn::Conv2dOptions(1, width, 3).padding(1)))),
      down_(register_module(
          "down",
          torch::nn::Conv2d(torch::nn::Conv2dOptions(width, 2 * width, 3).stride(2).padding(1)))),
      block1_(register_module("block1", ResidualBlock(width))),
      block2_(register_module("block2", ResidualBlock(2 * width))),
      head_(register_module("head", torch::nn::Linear(2 * width, 10))) {}

torch::Tensor ResidualCnn::forward(torch::Tensor pixels) {
  auto x = pixels.view({-1, 1, 28, 28});
  x = F::max_pool2d(torch::relu(stem_(x)), F::MaxPool2dFuncOptions(2));
  x = block2_(torch::relu(down_(block1_(x))));
  return head_(x.mean({2, 3}));
}

std::shared_ptr<Classifier> makeModel(const std::string& name, int64_t hidden, int64_t width) {
  if (name == "mlp") return std::make_shared<Mlp>(hidden);
  if (name == "cnn") return std::make_shared<ResidualCnn>(width);
  throw ConfigError("model = \"" + name + "\": allowed: mlp, cnn");
}

}  // namespace ddprun::trainers
