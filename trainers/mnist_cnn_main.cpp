// mnist_cnn: data-parallel training of a small residual CNN on Fashion-MNIST (or any
// MNIST-format data), started by ddprun:
// `ddprun --nproc-per-node=2 mnist_cnn --config configs/mnist_cnn.json`.
#include "trainers/trainer_main.h"

int main(int argc, char** argv) {
  ddprun::runtime::exitProcess(ddprun::trainers::trainerMain(
      argc, argv,
      {.name = "mnist_cnn",
       .model = "cnn",
       .description = "mnist_cnn: data-parallel residual-CNN training on MNIST-format data "
                      "(LibTorch)"}));
}
