// The idx.gz reader: real files written with zlib, then damaged in the ways files get damaged.
#include "tests/support/catch_torch.h"
#include "tests/support/skip.h"

#include "test_files.h"
#include "trainers/mnist_data.h"

using namespace ddprun::trainers;
using namespace ddprun::trainers::testing;
using Catch::Matchers::Contains;

TEST_CASE("a valid split loads with normalised pixels and int64 labels", "[data]") {
  TempDir dir;
  writeSplit(dir.path(), "train", 30);
  const auto split = loadMnist({.dir = dir.path(), .split = Split::Train});
  REQUIRE(split.size() == 30);
  REQUIRE((split.pixels.sizes() == torch::IntArrayRef{30, 784}));
  REQUIRE(split.pixels.dtype() == torch::kUInt8);
  REQUIRE(split.labels.dtype() == torch::kInt64);
  CHECK(split.labels[13].item<int64_t>() == 3);
  const auto rows = split.images(torch::tensor({7, 0, 7}, torch::kInt64));
  REQUIRE((rows.sizes() == torch::IntArrayRef{3, 784}));
  REQUIRE(rows.dtype() == torch::kFloat32);
  const float expected = (7.0f / 255.0f - kPixelMean) / kPixelStd;
  CHECK(rows[0][100].item<float>() == Approx(expected));
  CHECK(torch::equal(rows[0], rows[2]));
  CHECK(split.images(torch::empty({0}, torch::kInt64)).size(0) == 0);
  REQUIRE_THROWS(split.images(torch::tensor({30}, torch::kInt64)));  // no row 30
}

TEST_CASE("limit reads only the first examples", "[data]") {
  TempDir dir;
  writeSplit(dir.path(), "t10k", 50);
  const auto split = loadMnist({.dir = dir.path(), .split = Split::Test, .limit = 20});
  REQUIRE(split.size() == 20);
  CHECK(split.labels[19].item<int64_t>() == 9);
}

TEST_CASE("the real Fashion-MNIST files load (dataset-fashion-mnist)", "[data]") {
  if (!std::filesystem::exists(mnistFilePath(kDefaultDataDir, Split::Test, false))) {
    return ddprun::testing::skipUnlessCi("Fashion-MNIST is not installed in " +
                                         std::string(kDefaultDataDir) +
                                         " (Debian package dataset-fashion-mnist)");
  }
  const auto test = loadMnist({.split = Split::Test});
  REQUIRE(test.size() == 10000);
  // Fashion-MNIST's test set is balanced: 1000 of each class.
  CHECK(torch::bincount(test.labels).eq(1000).all().item<bool>());
  const auto all = test.images(torch::arange(test.size(), torch::kInt64));
  CHECK(all.mean().item<float>() == Approx(0.0).margin(0.05));
  // Bit for bit what normalising the whole split at load gave (the trainers did until the
  // pixels stayed uint8), so runs and their checkpoints are unchanged.
  const auto whole = test.pixels.to(torch::kFloat32).div_(255.0f).sub_(kPixelMean).div_(kPixelStd);
  CHECK(torch::equal(all, whole));
  // And rows picked out of order are the same rows.
  const auto idx = torch::tensor({9999, 3, 512, 3}, torch::kInt64);
  CHECK(torch::equal(test.images(idx), whole.index_select(0, idx)));
}

TEST_CASE("a missing directory or file is named", "[data][errors]") {
  TempDir dir;
  REQUIRE_THROWS_WITH(loadMnist({.dir = dir / "nope"}),
                      Contains(dir / "nope") && Contains("does not exist") && Contains("--data"));
  writeSplit(dir.path(), "t10k", 10);  // only the test split
  REQUIRE_THROWS_WITH(loadMnist({.dir = dir.path(), .split = Split::Train}),
                      Contains("train-images-idx3-ubyte.gz") && Contains("does not exist"));
}

TEST_CASE("a truncated gzip file is reported as truncated", "[data][errors]") {
  TempDir dir;
  writeSplit(dir.path(), "train", 200);
  const std::string images = dir / "train-images-idx3-ubyte.gz";
  auto bytes = readFile(images);
  bytes.resize(bytes.size() / 2);
  writeFile(images, bytes);
  REQUIRE_THROWS_AS(loadMnist({.dir = dir.path()}), DataError);
  REQUIRE_THROWS_WITH(loadMnist({.dir = dir.path()}), Contains(images) && Contains("truncated"));
}

TEST_CASE("a gzip file with damaged bytes is reported as corrupt", "[data][errors]") {
  TempDir dir;
  writeSplit(dir.path(), "train", 2000);
  const std::string labels = dir / "train-labels-idx1-ubyte.gz";
  std::vector<uint8_t> random(2000);
  uint32_t state = 12345;
  for (auto& b : random) b = static_cast<uint8_t>((state = state * 1103515245 + 12345) >> 16) % 10;
  writeGz(labels, idxBytes({2000}, random));  // labels that do not compress to nothing
  auto bytes = readFile(labels);
  REQUIRE(bytes.size() > 400);
  for (size_t i = 20; i < bytes.size() - 8; ++i) bytes[i] ^= 0x5a;
  writeFile(labels, bytes);
  REQUIRE_THROWS_WITH(loadMnist({.dir = dir.path()}), Contains(labels) && Contains("corrupt"));
}

TEST_CASE("a bad CRC in the gzip trailer is caught", "[data][errors]") {
  TempDir dir;
  writeSplit(dir.path(), "train", 20);
  const std::string labels = dir / "train-labels-idx1-ubyte.gz";
  auto bytes = readFile(labels);
  bytes[bytes.size() - 8] ^= 0xff;  // first byte of the CRC-32
  writeFile(labels, bytes);
  REQUIRE_THROWS_WITH(loadMnist({.dir = dir.path()}), Contains(labels) && Contains("corrupt"));
}

TEST_CASE("wrong magic or shape or counts or labels are named", "[data][errors]") {
  TempDir dir;
  writeSplit(dir.path(), "train", 10);
  const std::string images = dir / "train-images-idx3-ubyte.gz";
  const std::string labels = dir / "train-labels-idx1-ubyte.gz";

  writeGz(images, {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'});
  CHECK_THROWS_WITH(loadMnist({.dir = dir.path()}),
                    Contains(images) && Contains("not an idx file") && Contains("magic"));

  writeGz(images, idxBytes({10, 28}, std::vector<uint8_t>(280)));
  CHECK_THROWS_WITH(loadMnist({.dir = dir.path()}),
                    Contains(images) && Contains("has 2 dimensions, expected 3"));

  writeGz(images, idxBytes({10, 32, 32}, std::vector<uint8_t>(10 * 32 * 32)));
  CHECK_THROWS_WITH(loadMnist({.dir = dir.path()}), Contains("32x32, expected 28x28"));

  writeGz(images, idxBytes({10, 28, 28}, std::vector<uint8_t>(10 * 784 + 5)));
  CHECK_THROWS_WITH(loadMnist({.dir = dir.path()}),
                    Contains(images) && Contains("more bytes than its header"));

  writeGz(images, idxBytes({12, 28, 28}, std::vector<uint8_t>(12 * 784)));
  CHECK_THROWS_WITH(loadMnist({.dir = dir.path()}),
                    Contains(labels) && Contains("has 10 labels") && Contains("12 images"));

  writeGz(images, idxBytes({10, 28, 28}, std::vector<uint8_t>(10 * 784)));
  writeGz(labels, idxBytes({10}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 42}));
  CHECK_THROWS_WITH(loadMnist({.dir = dir.path()}),
                    Contains(labels) && Contains("label 42 at index 9 is outside 0..9"));

  writeFile(labels, {});
  CHECK_THROWS_WITH(loadMnist({.dir = dir.path()}), Contains(labels) && Contains("truncated"));
}
