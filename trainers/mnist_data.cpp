#include "trainers/mnist_data.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <sstream>

namespace ddprun::trainers {
namespace {

constexpr uint8_t kUnsignedByteType = 0x08;
constexpr int64_t kImageSide = 28;
constexpr int64_t kClasses = 10;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw DataError("data file " + path + ": " + what);
}

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// zlib's error text without the "path: " prefix gzerror adds.
std::string zlibMessage(gzFile f, const std::string& path, int* code) {
  std::string msg = gzerror(f, code);
  if (msg.rfind(path + ": ", 0) == 0) msg = msg.substr(path.size() + 2);
  return msg;
}

// Reads exactly n bytes or explains why not: a zlib error (corrupt stream, bad CRC) or the
// end of the data (a truncated file).
void readExactly(gzFile f, const std::string& path, uint8_t* out, size_t n, const char* what) {
  size_t done = 0;
  while (done < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
    const int got = gzread(f, out + done, chunk);
    if (got < 0) {
      int code = 0;
      const std::string msg = zlibMessage(f, path, &code);
      fail(path, std::string("corrupt gzip data while reading ") + what + " (zlib: " + msg + ")");
    }
    if (got == 0) {
      int code = 0;
      const std::string msg = zlibMessage(f, path, &code);
      std::ostringstream os;
      os << "truncated: " << what << " needs " << n << " bytes but the file ends after " << done;
      if (code != Z_OK) os << " (zlib: " << msg << ")";
      fail(path, os.str());
    }
    done += static_cast<size_t>(got);
  }
}

uint32_t bigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

IdxArray readIdxFile(const std::string& path, int expectedRank, int64_t limit) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    fail(path, "does not exist (use --data DIR to point at a directory with the MNIST-format "
               "files; Debian's dataset-fashion-mnist package installs them in " +
                   std::string(kDefaultDataDir) + ")");
  }
  if (!std::filesystem::is_regular_file(path, ec)) fail(path, "is not a regular file");

  GzFile file(gzopen(path.c_str(), "rb"));
  if (!file) fail(path, std::string("cannot be opened: ") + std::strerror(errno));
  gzbuffer(file.get(), 1 << 17);

  std::array<uint8_t, 4> magic{};
  readExactly(file.get(), path, magic.data(), magic.size(), "the idx header");
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != kUnsignedByteType) {
    std::ostringstream os;
    os << "not an idx file of unsigned bytes (magic bytes " << int{magic[0]} << " " << int{magic[1]}
       << " " << int{magic[2]} << " " << int{magic[3]} << ", expected 0 0 8 " << expectedRank
       << ")";
    fail(path, os.str());
  }
  if (magic[3] != expectedRank) {
    std::ostringstream os;
    os << "has " << int{magic[3]} << " dimensions, expected " << expectedRank;
    fail(path, os.str());
  }

  IdxArray out;
  std::vector<uint8_t> dimBytes(4 * static_cast<size_t>(expectedRank));
  readExactly(file.get(), path, dimBytes.data(), dimBytes.size(), "the idx dimensions");
  int64_t total = 1;
  for (int i = 0; i < expectedRank; ++i) {
    const int64_t d = bigEndian32(&dimBytes[4 * static_cast<size_t>(i)]);
    if (d == 0) fail(path, "dimension " + std::to_string(i) + " is 0");
    if (d > (int64_t{1} << 31) / total) fail(path, "dimensions are implausibly large");
    out.dims.push_back(d);
    total *= d;
  }
  const int64_t fullCount = out.dims[0];
  if (limit > 0 && limit < fullCount) {
    out.dims[0] = limit;
    total = total / fullCount * limit;
  }

  out.bytes.resize(static_cast<size_t>(total));
  readExactly(file.get(), path, out.bytes.data(), out.bytes.size(), "the data");
  if (out.dims[0] == fullCount) {
    // Reading past the end makes zlib check the gzip trailer (CRC and length) and shows
    // whether the file has more bytes than its header announces.
    uint8_t extra = 0;
    const int got = gzread(file.get(), &extra, 1);
    int code = 0;
    const std::string msg = zlibMessage(file.get(), path, &code);
    if (got < 0 || (code != Z_OK && code != Z_BUF_ERROR)) {
      fail(path, "corrupt gzip data at the end of the file (zlib: " + msg + ")");
    }
    if (code == Z_BUF_ERROR) fail(path, "truncated gzip stream (zlib: " + msg + ")");
    if (got > 0) fail(path, "has more bytes than its header announces");
  }
  return out;
}

std::string mnistFilePath(const std::string& dir, Split split, bool labels) {
  const char* prefix = split == Split::Train ? "train" : "t10k";
  const char* kind = labels ? "labels-idx1" : "images-idx3";
  return (std::filesystem::path(dir) / (std::string(prefix) + "-" + kind + "-ubyte.gz")).string();
}

MnistSplit loadMnist(const MnistOptions& options) {
  const std::string imagesPath = mnistFilePath(options.dir, options.split, false);
  const std::string labelsPath = mnistFilePath(options.dir, options.split, true);
  if (!std::filesystem::is_directory(options.dir)) {
    throw DataError("data directory " + options.dir + " does not exist (use --data DIR; " +
                    "Debian's dataset-fashion-mnist package installs " + kDefaultDataDir + ")");
  }

  IdxArray images = readIdxFile(imagesPath, 3, options.limit);
  if (images.dims[1] != kImageSide || images.dims[2] != kImageSide) {
    std::ostringstream os;
    os << "images are " << images.dims[1] << "x" << images.dims[2] << ", expected 28x28";
    fail(imagesPath, os.str());
  }
  IdxArray labels = readIdxFile(labelsPath, 1, options.limit);
  if (labels.dims[0] != images.dims[0]) {
    std::ostringstream os;
    os << "has " << labels.dims[0] << " labels but " << imagesPath << " has " << images.dims[0]
       << " images";
    fail(labelsPath, os.str());
  }
  for (size_t i = 0; i < labels.bytes.size(); ++i) {
    if (labels.bytes[i] >= kClasses) {
      std::ostringstream os;
      os << "label " << int{labels.bytes[i]} << " at index " << i << " is outside 0..9";
      fail(labelsPath, os.str());
    }
  }

  const int64_t n = images.dims[0];
  MnistSplit split;
  // The pixel tensor owns the bytes read (no copy); to() makes the labels an owning tensor.
  auto bytes = std::make_shared<std::vector<uint8_t>>(std::move(images.bytes));
  split.pixels = torch::from_blob(bytes->data(), {n, kImageSide * kImageSide},
                                  [bytes](void*) mutable { bytes.reset(); }, torch::kUInt8);
  split.labels = torch::from_blob(labels.bytes.data(), {n}, torch::kUInt8).to(torch::kInt64);
  return split;
}

torch::Tensor MnistSplit::images(const torch::Tensor& idx) const {
  // The normalised value of each pixel value, by the operations that once normalised the split.
  static const std::array<float, 256> table = [] {
    const auto t = torch::arange(256, torch::kInt32)
                       .to(torch::kFloat32)
                       .div_(255.0f)
                       .sub_(kPixelMean)
                       .div_(kPixelStd)
                       .contiguous();
    std::array<float, 256> values{};
    std::copy_n(t.data_ptr<float>(), values.size(), values.begin());
    return values;
  }();
  const auto rows = pixels.index_select(0, idx).contiguous();  // checks the indices
  auto out = torch::empty(rows.sizes(), torch::TensorOptions().dtype(torch::kFloat32));
  const uint8_t* in = rows.data_ptr<uint8_t>();
  float* values = out.data_ptr<float>();
  for (int64_t i = 0, n = rows.numel(); i < n; ++i) values[i] = table[in[i]];
  return out;
}

}  // namespace ddprun::trainers
