#pragma once
// Include this instead of <catch2/catch.hpp> in tests that use LibTorch. LibTorch pulls in
// glog, whose CHECK aborts the process instead of failing the test: Torch comes first, its CHECK
// is dropped, then Catch defines its own.
#include <torch/torch.h>
#undef CHECK
#include <catch2/catch.hpp>
