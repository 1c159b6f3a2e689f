#pragma once
// MNIST-format data sets (MNIST, Fashion-MNIST, ...) read straight from the gzipped idx files.
//
// A split is four files in one directory:
//   train-images-idx3-ubyte.gz  train-labels-idx1-ubyte.gz
//   t10k-images-idx3-ubyte.gz   t10k-labels-idx1-ubyte.gz
// The idx format: a 4-byte magic (0, 0, type 0x08 = unsigned byte, number of dimensions),
// one big-endian uint32 per dimension, then the bytes in row-major order. Files are read with
// zlib (gzread also reads an uncompressed file transparently), with no unpacking step.
//
// Every problem with a file -- missing, unreadable, not idx, wrong shape, truncated, failing
// its gzip CRC, labels out of range, images and labels disagreeing in count -- throws
// DataError naming the file and what is wrong.
#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "base/errors.h"

namespace ddprun::trainers {

// A data file is missing or malformed.
class DataError : public ddprun::Error {
 public:
  using Error::Error;
};

// Where the trainers look when no --data is given: Debian's dataset-fashion-mnist package.
inline constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";

// Pixel normalisation (x / 255 - mean) / std with Fashion-MNIST's training-set statistics.
// bench/ddp_mnist.py uses the same constants.
inline constexpr float kPixelMean = 0.2860f;
inline constexpr float kPixelStd = 0.3530f;

// The raw content of one idx file: its dimensions and bytes (row-major).
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;
};

// Reads an idx file of unsigned bytes with `expectedRank` dimensions. With limit > 0 only the
// first `limit` entries along dimension 0 are read (dims[0] is reduced accordingly); otherwise
// the whole file is read and must end exactly where the header says.
IdxArray readIdxFile(const std::string& path, int expectedRank, int64_t limit = 0);

enum class Split { Train, Test };

// One split in memory. The pixels stay as the file has them, uint8: every process of a job
// holds its splits (each rank, the spare template and every spare), and as float32 Fashion-MNIST
// would take 220 MB of private memory in each, four times the bytes, every page of it touched
// once at load (dear where a first touch costs 11-20 us: docs/recovery.md, stop 53) and copied
// into each fork's page table. images(idx) normalises just the rows a batch takes.
struct MnistSplit {
  torch::Tensor pixels;  // [N, 784] uint8, row-major as in the file
  torch::Tensor labels;  // [N] int64 in 0..9
  int64_t size() const { return labels.size(0); }
  // Rows `idx` (int64, each in 0..N-1) as the model takes them: float32 [idx.size(0), 784],
  // pixel p as (p / 255 - kPixelMean) / kPixelStd. Bit for bit what normalising the whole split
  // with those operations gives: the value of each of the 256 pixel values is computed once
  // with them (tests/trainers/mnist_data_test.cpp checks the two agree).
  torch::Tensor images(const torch::Tensor& idx) const;
};

struct MnistOptions {
  std::string dir = kDefaultDataDir;
  Split split = Split::Train;
  int64_t limit = 0;  // > 0: only the first `limit` examples
};

// The file name of a split's images or labels inside the data directory.
std::string mnistFilePath(const std::string& dir, Split split, bool labels);

// Loads and validates one split (28x28 images, labels 0..9, equal counts).
MnistSplit loadMnist(const MnistOptions& options);

}  // namespace ddprun::trainers
