#pragma once
// The bundled models. Each is a classifier from normalised 28x28 pixels, given as [B, 784],
// to 10 logits [B, 10]. bench/ddp_mnist.py defines the same shapes in Python.
#include <memory>
#include <string>

#include <torch/torch.h>

namespace ddprun::trainers {

// What the training loop needs from a model: a forward pass; parameters come from Module.
class Classifier : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor pixels) = 0;
};

// 784 -> hidden -> 10 with ReLU: the model of PyTorch's MNIST DDP examples.
class Mlp : public Classifier {
 public:
  explicit Mlp(int64_t hidden);
  torch::Tensor forward(torch::Tensor pixels) override;

 private:
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
};

// x + conv(relu(conv(x))), then relu: two 3x3 convolutions that keep the shape.
class ResidualBlockImpl : public torch::nn::Module {
 public:
  explicit ResidualBlockImpl(int64_t channels);
  torch::Tensor forward(torch::Tensor x);

 private:
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
};
TORCH_MODULE(ResidualBlock);

// A small residual CNN: stem conv (width) + 2x2 max-pool to 14x14, a residual block,
// a stride-2 conv to 2*width channels at 7x7, a residual block, global average pool, linear.
// No batch norm, so there are no buffers to keep in sync across ranks.
class ResidualCnn : public Classifier {
 public:
  explicit ResidualCnn(int64_t width);
  torch::Tensor forward(torch::Tensor pixels) override;

 private:
  torch::nn::Conv2d stem_{nullptr}, down_{nullptr};
  ResidualBlock block1_{nullptr}, block2_{nullptr};
  torch::nn::Linear head_{nullptr};
};

// "mlp" (hidden) or "cnn" (width); weights drawn from torch's default generator, so seed it
// first for reproducible initial weights.
std::shared_ptr<Classifier> makeModel(const std::string& name, int64_t hidden, int64_t width);

}  // namespace ddprun::trainers
