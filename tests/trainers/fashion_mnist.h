#pragma once
// Whether the trainers' default data (Debian's dataset-fashion-mnist) is installed, for the tests
// that train on it.
#include <filesystem>
#include <string>

#include "tests/support/skip.h"
#include "trainers/mnist_data.h"

namespace ddprun::trainers::testing {

inline bool haveData() {
  return std::filesystem::exists(mnistFilePath(kDefaultDataDir, Split::Train, false));
}

// A skip (ctest: Skipped), or a failure under CI=true, where scripts/setup installed the data.
inline void skipWithoutData() {
  ddprun::testing::skipUnlessCi("Fashion-MNIST is not installed in " + std::string(kDefaultDataDir) +
                                " (Debian package dataset-fashion-mnist)");
}

}  // namespace ddprun::trainers::testing
