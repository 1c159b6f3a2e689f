#pragma once
// Include this instead of <catch2/catch.hpp> in tests that use Torch: LibTorch's glog headers
// define their own CHECK (which aborts the process), so they are included first and that one
// macro is dropped before Catch defines its own.
#include <torch/torch.h>
#undef CHECK
#include <catch2/catch.hpp>
