// Settings: defaults, file, flags overriding the file, and the errors for bad input.
#include <catch2/catch.hpp>

#include <fstream>

#include "test_files.h"
#include "trainers/train_config.h"

using namespace ddprun::trainers;
using namespace ddprun::trainers::testing;
using Catch::Matchers::Contains;

namespace {
std::string writeConfig(const TempDir& dir, const std::string& text) {
  const std::string path = dir / "config.json";
  std::ofstream(path) << text;
  return path;
}
}  // namespace

TEST_CASE("flags override the file and the file overrides the defaults", "[config]") {
  TempDir dir;
  const auto file = writeConfig(dir, R"({"lr": 0.2, "batch_size": 32, "epochs": 3})");
  const auto c = loadTrainConfig({.file = file, .flags = {{"batch_size", "128"}, {"evaluate", "false"}}});
  CHECK(c.lr == 0.2);
  CHECK(c.batch_size == 128);
  CHECK(c.epochs == 3);
  CHECK_FALSE(c.evaluate);
  CHECK(c.momentum == TrainConfig{}.momentum);
}

TEST_CASE("the shipped configs load", "[config]") {
  for (const char* name : {"mnist_mlp.json", "mnist_cnn.json"}) {
    const std::string path = std::string(DDPRUN_SOURCE_DIR) + "/configs/" + name;
    INFO(path);
    const auto c = loadTrainConfig({.file = path});
    CHECK(c.batch_size > 0);
    CHECK_FALSE(c.checkpoint_dir.empty());
  }
}

TEST_CASE("every setting round-trips through JSON", "[config]") {
  TrainConfig c;
  c.lr = 0.125;
  c.lr_schedule = "step";
  c.seed = 7;
  TrainConfig back;
  applySettings(back, toJson(c), "round trip");
  CHECK(toJson(back) == toJson(c));
  CHECK(flagName("checkpoint_interval") == "--checkpoint-interval");
  CHECK(settings().size() == toJson(c).size());
}

TEST_CASE("bad config files are reported with the file and the key and the value", "[config][errors]") {
  TempDir dir;
  CHECK_THROWS_WITH(loadTrainConfig({.file = dir / "missing.json"}),
                    Contains("missing.json") && Contains("cannot be opened"));

  auto file = writeConfig(dir, R"({"lr": 0.1,})");
  CHECK_THROWS_AS(loadTrainConfig({.file = file}), ddprun::ConfigError);
  CHECK_THROWS_WITH(loadTrainConfig({.file = file}), Contains(file) && Contains("not valid JSON"));

  file = writeConfig(dir, R"([1, 2])");
  CHECK_THROWS_WITH(loadTrainConfig({.file = file}), Contains("expected a JSON object"));

  file = writeConfig(dir, R"({"learning_rate": 0.1})");
  CHECK_THROWS_WITH(loadTrainConfig({.file = file}),
                    Contains(file) && Contains("unknown setting 'learning_rate'") &&
                        Contains("lr"));

  file = writeConfig(dir, R"({"lr": "fast"})");
  CHECK_THROWS_WITH(loadTrainConfig({.file = file}),
                    Contains(file + ": lr = \"fast\"") && Contains("expected a number"));

  file = writeConfig(dir, R"({"batch_size": 0})");
  CHECK_THROWS_WITH(loadTrainConfig({.file = file}), Contains("batch_size = 0: must be >= 1"));

  file = writeConfig(dir, R"({"batch_size": 6.5})");
  CHECK_THROWS_WITH(loadTrainConfig({.file = file}), Contains("expected an integer"));

  file = writeConfig(dir, R"({"lr_schedule": "linear"})");
  CHECK_THROWS_WITH(loadTrainConfig({.file = file}),
                    Contains("lr_schedule = \"linear\"") && Contains("constant step cosine"));

  file = writeConfig(dir, R"({"mixed_precision": "yes"})");
  CHECK_THROWS_WITH(loadTrainConfig({.file = file}), Contains("expected true or false"));
}

TEST_CASE("bad flag values are reported with the flag", "[config][errors]") {
  CHECK_THROWS_WITH(loadTrainConfig({.flags = {{"lr", "-1"}}}),
                    Contains("flag --lr = -1") && Contains("> 0"));
  CHECK_THROWS_WITH(loadTrainConfig({.flags = {{"lr", "0.1x"}}}),
                    Contains("flag --lr = '0.1x'") && Contains("expected a number"));
  CHECK_THROWS_WITH(loadTrainConfig({.flags = {{"epochs", "two"}}}),
                    Contains("flag --epochs = 'two'") && Contains("expected an integer"));
  CHECK_THROWS_WITH(loadTrainConfig({.flags = {{"seed", "-3"}}}), Contains(">= 0"));
  CHECK_THROWS_WITH(loadTrainConfig({.flags = {{"device", "tpu"}}}),
                    Contains("flag --device = \"tpu\"") && Contains("auto cpu cuda"));
}

TEST_CASE("inconsistent settings are rejected", "[config][errors]") {
  CHECK_THROWS_WITH(loadTrainConfig({.flags = {{"checkpoint_interval", "10"}}}),
                    Contains("needs a checkpoint_dir"));
  CHECK_THROWS_WITH(loadTrainConfig({.flags = {{"train_limit", "10"}, {"batch_size", "64"}}}),
                    Contains("smaller than one batch"));
}
