#pragma once
// Helpers for the trainer tests: a temporary directory and small MNIST-format files.
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace ddprun::trainers::testing {

// A fresh directory under the system temp dir, removed with its content at scope exit.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("ddprun-trainers-test-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

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
