#pragma once
// Training settings: a JSON file (configs/mnist_*.json) merged with command-line flags.
//
// Every setting has one name. In the file it is a key (`batch_size`), on the command line the
// same name with dashes (`--batch-size`); a flag overrides the file, the file overrides the
// built-in default. Unknown keys, values of the wrong type and values out of range throw
// ConfigError naming the setting, where it came from (file or flag), the value, and what is
// allowed.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/errors.h"

namespace ddprun::trainers {

struct TrainConfig {
  std::string model = "mlp";  // "mlp" or "cnn"; must match the trainer executable
  int64_t hidden = 512;       // mlp: width of the hidden layer
  int64_t width = 16;         // cnn: channels of the first residual stage (the second has 2x)

  std::string data = "/usr/share/datasets/fashion-mnist";
  int64_t train_limit = 0;  // > 0: use only the first N training examples
  int64_t test_limit = 0;   // > 0: evaluate on the first N test examples only

  int64_t batch_size = 64;  // per rank; the global batch is batch_size * world size
  int64_t epochs = 2;
  // > 0: stop after this many optimizer steps, counted in global batches of the world size the
  // job started with (the same point of the data whatever the world size does later).
  int64_t max_steps = 0;
  uint64_t seed = 0;

  double lr = 0.05;
  double momentum = 0.9;
  double weight_decay = 0.0;
  std::string lr_schedule = "cosine";  // "constant", "step" or "cosine"
  int64_t lr_step_epochs = 1;          // step: multiply by lr_gamma every this many epochs
  double lr_gamma = 0.1;
  int64_t warmup_steps = 0;  // linear warm-up from 0 over the first steps (any schedule)
  // When the world size (hence the global batch) changes: "none" keeps lr (PyTorch's default);
  // "linear" scales it by the global batch over the global batch the job started with.
  std::string lr_scaling = "none";

  std::string checkpoint_dir;       // empty: no checkpoints, no resume
  int64_t checkpoint_interval = 0;  // steps between checkpoints; 0: at the end of each epoch
  int64_t log_interval = 100;       // steps between progress lines (rank 0)
  std::string metrics;              // JSON-lines file written by rank 0; empty: none
  std::string save_weights;         // rank 0 writes the final parameters here (torch::save)
  std::string device = "auto";      // "auto" (CUDA when visible), "cpu" or "cuda"
  bool mixed_precision = false;     // autocast to float16 on CUDA; ignored (with a notice) on CPU
  bool evaluate = true;             // evaluate on the test split after every epoch
};

// One setting as the user sees it: its name (JSON key; flag = --name with dashes), the JSON
// type it takes, and a one-line help text.
struct SettingInfo {
  std::string name;
  std::string type;  // "string", "integer", "number" or "boolean"
  std::string help;
};
const std::vector<SettingInfo>& settings();

// The command-line spelling of a setting: "batch_size" -> "--batch-size".
std::string flagName(const std::string& setting);

// A layered source of settings: what the file said, then what the flags said.
struct ConfigSources {
  std::string file;                                        // path, or empty for none
  std::vector<std::pair<std::string, std::string>> flags;  // (setting name, raw flag value)
};

// Starts from `defaults`, applies the file (if any), then the flags, validates, and returns the
// result.
TrainConfig loadTrainConfig(const ConfigSources& sources, TrainConfig defaults = {});

// Applies one JSON object of settings (keys as in the file) on top of `config`;
// `origin` names the source in error messages ("configs/mnist_mlp.json", "flag --lr").
void applySettings(TrainConfig& config, const nlohmann::json& object, const std::string& origin);

// Checks ranges and combinations; throws ConfigError.
void validate(const TrainConfig& config);

// The settings as one JSON object (for the log and the metrics file).
nlohmann::json toJson(const TrainConfig& config);

}  // namespace ddprun::trainers
