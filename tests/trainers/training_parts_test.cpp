// Pure pieces of the training loop: LR schedules, metrics file, progress lines, models.
#include "tests/support/catch_torch.h"

#include <fstream>

#include "base/errors.h"
#include "test_files.h"
#include "trainers/lr_schedule.h"
#include "trainers/metrics.h"
#include "trainers/models.h"

using namespace ddprun::trainers;
using namespace ddprun::trainers::testing;

TEST_CASE("cosine decays from base to zero", "[schedule]") {
  const LrScheduleOptions o{.kind = "cosine", .base = 0.1, .totalSteps = 100};
  CHECK(learningRate(o, 0) == Approx(0.1));
  CHECK(learningRate(o, 50) == Approx(0.05));
  CHECK(learningRate(o, 100) == Approx(0.0).margin(1e-12));
  CHECK(learningRate(o, 25) > learningRate(o, 26));
}

TEST_CASE("step multiplies by gamma every stepEpochs epochs", "[schedule]") {
  const LrScheduleOptions o{.kind = "step", .base = 1.0, .stepsPerEpoch = 10, .stepEpochs = 2,
                            .gamma = 0.5};
  CHECK(learningRate(o, 0) == 1.0);
  CHECK(learningRate(o, 19) == 1.0);
  CHECK(learningRate(o, 20) == 0.5);
  CHECK(learningRate(o, 45) == 0.25);
}

TEST_CASE("warm-up ramps linearly and then the schedule applies", "[schedule]") {
  const LrScheduleOptions o{.kind = "constant", .base = 0.4, .warmupSteps = 4};
  CHECK(learningRate(o, 0) == Approx(0.1));
  CHECK(learningRate(o, 3) == Approx(0.4));
  CHECK(learningRate(o, 10) == Approx(0.4));
}

TEST_CASE("a resumed metrics file drops the steps that will be redone", "[metrics]") {
  TempDir dir;
  const std::string path = dir / "sub/metrics.jsonl";
  {
    MetricsFile m(path, -1);
    m.write({{"kind", "config"}});
    for (int step : {10, 20, 30, 40}) m.write({{"kind", "train"}, {"step", step}});
  }
  std::ofstream(path, std::ios::app) << R"({"kind":"train","st)";  // torn by a kill
  {
    MetricsFile m(path, 20);  // resumed from the checkpoint of step 20
    m.write({{"kind", "train"}, {"step", 30}});
  }
  std::ifstream in(path);
  std::vector<nlohmann::json> records;
  for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
  REQUIRE(records.size() == 4);
  CHECK(records[0]["kind"] == "config");
  CHECK(records[1]["step"] == 10);
  CHECK(records[2]["step"] == 20);
  CHECK(records[3]["step"] == 30);

  MetricsFile fresh(path, -1);  // a fresh run starts a new file
  fresh.write({{"step", 1}});
  CHECK(readFile(path).size() == std::string("{\"step\":1}\n").size());
}

TEST_CASE("progress lines carry epoch and step and loss and rate and ETA", "[metrics]") {
  const Progress p{.epoch = 2, .epochs = 4, .step = 200, .totalSteps = 1872, .loss = 0.52314,
                   .lr = 0.0498, .samplesPerSec = 9812.4, .etaSeconds = 93};
  CHECK(formatProgress(p) ==
        "epoch 2/4  step 200/1872  loss 0.5231  lr 0.0498  9812 samples/s  ETA 1:33");
  CHECK(formatDuration(3725) == "1:02:05");
  CHECK(formatDuration(-4) == "0:00");
}

TEST_CASE("models map B x 784 pixels to B x 10 logits and are reproducible from the seed", "[models]") {
  for (const char* name : {"mlp", "cnn"}) {
    INFO(name);
    torch::manual_seed(3);
    auto a = makeModel(name, 32, 4);
    torch::manual_seed(3);
    auto b = makeModel(name, 32, 4);
    const auto x = torch::randn({5, 784});
    const auto ya = a->forward(x);
    CHECK((ya.sizes() == torch::IntArrayRef{5, 10}));
    CHECK(torch::equal(ya, b->forward(x)));
    ya.sum().backward();
    for (const auto& p : a->parameters()) CHECK(p.grad().defined());
  }
  auto mlp = makeModel("mlp", 512, 0);
  int64_t count = 0;
  for (const auto& p : mlp->parameters()) count += p.numel();
  CHECK(count == 784 * 512 + 512 + 512 * 10 + 10);
  CHECK_THROWS_AS(makeModel("rnn", 1, 1), ddprun::ConfigError);
}
