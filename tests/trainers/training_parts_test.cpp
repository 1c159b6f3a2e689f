// Pure pieces of the training loop: LR schedules, metrics file, progress lines, models.
#include "tests/support/catch_torch.h"

#include <fstream>

#include "base/errors.h"
#include "test_files.h"
#include "trainers/lr_schedule.h"
#include "trainers/metrics.h"
#include "trainers/models.h"
#include "trainers/training_plan.h"

using namespace ddprun::trainers;
using namespace ddprun::trainers::testing;

TEST_CASE("cosine decays from base to zero over the run's samples", "[schedule]") {
  const LrScheduleOptions o{.kind = "cosine", .base = 0.1, .totalSamples = 1000};
  CHECK(learningRate(o, 0, 10) == Approx(0.1));
  CHECK(learningRate(o, 500, 10) == Approx(0.05));
  CHECK(learningRate(o, 1000, 10) == Approx(0.0).margin(1e-12));
  CHECK(learningRate(o, 250, 10) > learningRate(o, 260, 10));
  // The rate depends on the samples passed, not on the batch: a world-size change mid-run
  // continues the curve instead of jumping.
  CHECK(learningRate(o, 600, 10) == learningRate(o, 600, 40));
}

TEST_CASE("step multiplies by gamma every stepEpochs epochs of samples", "[schedule]") {
  const LrScheduleOptions o{.kind = "step", .base = 1.0, .samplesPerEpoch = 100, .stepEpochs = 2,
                            .gamma = 0.5};
  CHECK(learningRate(o, 0, 10) == 1.0);
  CHECK(learningRate(o, 199, 10) == 1.0);
  CHECK(learningRate(o, 200, 10) == 0.5);
  CHECK(learningRate(o, 450, 10) == 0.25);
}

TEST_CASE("warm-up ramps linearly and then the schedule applies", "[schedule]") {
  // 4 warm-up steps of 10 samples: (step + 1) / 4, as PyTorch's linear warm-up.
  const LrScheduleOptions o{.kind = "constant", .base = 0.4, .warmupSamples = 40};
  CHECK(learningRate(o, 0, 10) == Approx(0.1));
  CHECK(learningRate(o, 30, 10) == Approx(0.4));
  CHECK(learningRate(o, 100, 10) == Approx(0.4));
  CHECK(learningRate(o, 10, 20) == Approx(0.3));  // a bigger global batch after a change
}

TEST_CASE("the plan counts a run in samples with the reference global batch", "[plan]") {
  // 1000 samples, 2 ranks x 16 at the start: 31 steps per epoch (the last 8 samples dropped).
  const TrainingPlan p = makePlan({.datasetSize = 1000, .epochs = 3, .referenceBatch = 16,
                                   .referenceWorldSize = 2});
  CHECK(p.referenceGlobalBatch == 32);
  CHECK(p.referenceStepsPerEpoch == 31);
  CHECK(p.endSamples == 3000);
  CHECK(p.seenAfterSteps(31) == 1000);  // the epoch's end, tail included
  CHECK(p.seenAfterSteps(33) == 1064);
  // At the reference world size the steps to the end are what a fixed-size run takes.
  CHECK(stepsToEnd(p, 0, 0, 2, 16) == 93);
  // At another world size the same samples take other steps: 1 rank x 16 -> 62 per epoch.
  CHECK(stepsToEnd(p, 0, 0, 1, 16) == 186);
  CHECK(stepsToEnd(p, 1, 320, 1, 16) == 42 + 62);  // mid-epoch: (1000 - 320) / 16 = 42
  CHECK(stepsToEnd(p, 3, 0, 1, 16) == 0);

  // max_steps and warmup_steps are steps of the reference global batch.
  const TrainingPlan q = makePlan({.datasetSize = 1000, .epochs = 3, .maxSteps = 40,
                                   .warmupSteps = 5, .referenceBatch = 16,
                                   .referenceWorldSize = 2});
  CHECK(q.endSamples == 1000 + 9 * 32);
  CHECK(q.warmupSamples == 160);
  CHECK(stepsToEnd(q, 0, 0, 2, 16) == 40);
  // At 3 ranks (global 48): 20 steps finish epoch 0 (960 of 1000), then ceil(288 / 48) = 6.
  CHECK(stepsToEnd(q, 0, 0, 3, 16) == 26);
  CHECK_THROWS_WITH(makePlan({.datasetSize = 100, .referenceBatch = 64, .referenceWorldSize = 2}),
                    Catch::Contains("batch_size = 64 is larger than a rank's share"));
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
