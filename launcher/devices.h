#pragma once
// Counting this machine's devices for --nproc-per-node=cpu|gpu|auto.
namespace ddprun::launcher {

// Online CPUs (as Python's os.cpu_count()).
int cpuCount();
// Visible CUDA devices, honouring CUDA_VISIBLE_DEVICES. libcuda is opened at run time, so
// ddprun neither links CUDA nor needs it; without a driver the answer is 0.
int cudaDeviceCount();

}  // namespace ddprun::launcher
