#pragma once
// Helpers for the trainer tests: small MNIST-format files (and tests/support's TempDir).
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tests/support/temp_dir.h"

namespace ddprun::trainers::testing {

using ddprun::testing::TempDir;

inline std::vector<uint8_t> idxBytes(const std::vector<uint32_t>& dims,
                                     const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(d >> shift));
  }
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

inline void writeGz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

inline std::vector<uint8_t> readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void writeFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A valid split of n examples: image i has every pixel = i % 256, label i % 10.
inline void writeSplit(const std::string& dir, const std::string& prefix, uint32_t n) {
  std::vector<uint8_t> pixels(static_cast<size_t>(n) * 784), labels(n);
  for (uint32_t i = 0; i < n; ++i) {
    std::fill_n(pixels.begin() + static_cast<std::ptrdiff_t>(i) * 784, 784, static_cast<uint8_t>(i % 256));
    labels[i] = static_cast<uint8_t>(i % 10);
  }
  writeGz(dir + "/" + prefix + "-images-idx3-ubyte.gz", idxBytes({n, 28, 28}, pixels));
  writeGz(dir + "/" + prefix + "-labels-idx1-ubyte.gz", idxBytes({n}, labels));
}

}  // namespace ddprun::trainers::testing
