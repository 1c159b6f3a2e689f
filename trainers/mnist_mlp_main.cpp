// mnist_mlp: data-parallel training of a 784-512-10 MLP on Fashion-MNIST (or any MNIST-format
// data), started by ddprun: `ddprun --nproc-per-node=2 mnist_mlp --config configs/mnist_mlp.json`.
#include "trainers/trainer_main.h"

int main(int argc, char** argv) {
  ddprun::runtime::exitProcess(ddprun::trainers::trainerMain(
      argc, argv,
      {.name = "mnist_mlp",
       .model = "mlp",
       .description = "mnist_mlp: data-parallel MLP training on MNIST-format data (LibTorch)"}));
}
