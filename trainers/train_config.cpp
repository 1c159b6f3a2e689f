#include "trainers/train_config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>

namespace ddprun::trainers {
namespace {

using nlohmann::json;

// How one setting is read from JSON and written back. `apply` checks the type and the range
// and throws ConfigError with `where` ("key 'lr' in FILE" or "flag --lr").
struct Setting {
  SettingInfo info;
  std::function<void(TrainConfig&, const json&, const std::string& where)> apply;
  std::function<json(const TrainConfig&)> get;
};

[[noreturn]] void bad(const std::string& where, const json& value, const std::string& allowed) {
  throw ConfigError(where + " = " + value.dump() + ": " + allowed);
}

Setting integer(std::string name, int64_t TrainConfig::*field, int64_t min, std::string help) {
  return {{name, "integer", help},
          [field, min](TrainConfig& c, const json& v, const std::string& where) {
            if (!v.is_number_integer()) bad(where, v, "expected an integer");
            const int64_t x = v.get<int64_t>();
            if (x < min) bad(where, v, "must be >= " + std::to_string(min));
            c.*field = x;
          },
          [field](const TrainConfig& c) { return json(c.*field); }};
}

Setting number(std::string name, double TrainConfig::*field, double min, bool minExclusive,
               std::string help) {
  return {{name, "number", help},
          [field, min, minExclusive](TrainConfig& c, const json& v, const std::string& where) {
            if (!v.is_number()) bad(where, v, "expected a number");
            const double x = v.get<double>();
            if (!std::isfinite(x) || (minExclusive ? x <= min : x < min)) {
              std::ostringstream os;
              os << "must be a finite number " << (minExclusive ? "> " : ">= ") << min;
              bad(where, v, os.str());
            }
            c.*field = x;
          },
          [field](const TrainConfig& c) { return json(c.*field); }};
}

Setting text(std::string name, std::string TrainConfig::*field, std::vector<std::string> choices,
             std::string help) {
  return {{name, "string", help},
          [field, choices](TrainConfig& c, const json& v, const std::string& where) {
            if (!v.is_string()) bad(where, v, "expected a string");
            const std::string s = v.get<std::string>();
            if (!choices.empty() && std::find(choices.begin(), choices.end(), s) == choices.end()) {
              std::string allowed = "allowed:";
              for (const auto& ch : choices) allowed += " " + ch;
              bad(where, v, allowed);
            }
            c.*field = s;
          },
          [field](const TrainConfig& c) { return json(c.*field); }};
}

Setting boolean(std::string name, bool TrainConfig::*field, std::string help) {
  return {{name, "boolean", help},
          [field](TrainConfig& c, const json& v, const std::string& where) {
            if (!v.is_boolean()) bad(where, v, "expected true or false");
            c.*field = v.get<bool>();
          },
          [field](const TrainConfig& c) { return json(c.*field); }};
}

const std::vector<Setting>& table() {
  static const std::vector<Setting> t = [] {
    std::vector<Setting> s;
    s.push_back(text("model", &TrainConfig::model, {"mlp", "cnn"}, "model architecture"));
    s.push_back(integer("hidden", &TrainConfig::hidden, 1, "mlp: hidden layer width"));
    s.push_back(integer("width", &TrainConfig::width, 1, "cnn: channels of the first stage"));
    s.push_back(text("data", &TrainConfig::data, {}, "directory with the MNIST-format .gz files"));
    s.push_back(integer("train_limit", &TrainConfig::train_limit, 0,
                        "use only the first N training examples (0: all)"));
    s.push_back(integer("test_limit", &TrainConfig::test_limit, 0,
                        "evaluate on the first N test examples (0: all)"));
    s.push_back(integer("batch_size", &TrainConfig::batch_size, 1, "examples per step per rank"));
    s.push_back(integer("epochs", &TrainConfig::epochs, 1, "passes over the training data"));
    s.push_back(integer("max_steps", &TrainConfig::max_steps, 0,
                        "stop after this many optimizer steps at the world size the job "
                        "started with (0: no limit)"));
    s.push_back({{"seed", "integer", "seed of the initial weights and the data order"},
                 [](TrainConfig& c, const json& v, const std::string& where) {
                   if (!v.is_number_integer() || v.get<int64_t>() < 0) {
                     bad(where, v, "expected an integer >= 0");
                   }
                   c.seed = v.get<uint64_t>();
                 },
                 [](const TrainConfig& c) { return json(c.seed); }});
    s.push_back(number("lr", &TrainConfig::lr, 0.0, true, "peak learning rate"));
    s.push_back(number("momentum", &TrainConfig::momentum, 0.0, false, "SGD momentum"));
    s.push_back(number("weight_decay", &TrainConfig::weight_decay, 0.0, false, "L2 penalty"));
    s.push_back(text("lr_schedule", &TrainConfig::lr_schedule, {"constant", "step", "cosine"},
                     "learning-rate schedule"));
    s.push_back(integer("lr_step_epochs", &TrainConfig::lr_step_epochs, 1,
                        "step schedule: epochs between decays"));
    s.push_back(number("lr_gamma", &TrainConfig::lr_gamma, 0.0, true,
                       "step schedule: factor applied at each decay"));
    s.push_back(integer("warmup_steps", &TrainConfig::warmup_steps, 0,
                        "linear warm-up steps at the start"));
    s.push_back(text("lr_scaling", &TrainConfig::lr_scaling, {"none", "linear"},
                     "when the world size changes: none (lr unchanged, as PyTorch) or linear "
                     "(lr x global batch / the global batch the job started with)"));
    s.push_back(text("checkpoint_dir", &TrainConfig::checkpoint_dir, {},
                     "directory for checkpoints; a restarted job resumes from the newest"));
    s.push_back(integer("checkpoint_interval", &TrainConfig::checkpoint_interval, 0,
                        "steps between checkpoints (0: at the end of each epoch)"));
    s.push_back(integer("log_interval", &TrainConfig::log_interval, 1,
                        "steps between progress lines"));
    s.push_back(text("metrics", &TrainConfig::metrics, {}, "JSON-lines metrics file (rank 0)"));
    s.push_back(text("save_weights", &TrainConfig::save_weights, {},
                     "write the final parameters to this file (rank 0)"));
    s.push_back(text("device", &TrainConfig::device, {"auto", "cpu", "cuda"}, "where to train"));
    s.push_back(boolean("mixed_precision", &TrainConfig::mixed_precision,
                        "float16 autocast on CUDA"));
    s.push_back(boolean("evaluate", &TrainConfig::evaluate, "evaluate after every epoch"));
    return s;
  }();
  return t;
}

const Setting& findSetting(const std::string& name, const std::string& origin) {
  for (const auto& s : table()) {
    if (s.info.name == name) return s;
  }
  std::string known;
  for (const auto& s : table()) known += (known.empty() ? "" : ", ") + s.info.name;
  throw ConfigError(origin + ": unknown setting '" + name + "' (known: " + known + ")");
}

// A flag's text as the JSON value its setting expects, so flags and files share one check.
json parseFlagValue(const Setting& s, const std::string& raw, const std::string& where) {
  const std::string& type = s.info.type;
  if (type == "string") return raw;
  if (type == "boolean") {
    if (raw == "true" || raw == "1" || raw == "yes" || raw == "on") return true;
    if (raw == "false" || raw == "0" || raw == "no" || raw == "off") return false;
    throw ConfigError(where + " = '" + raw + "': expected true or false");
  }
  if (type == "integer") {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(raw.data(), raw.data() + raw.size(), v);
    if (ec != std::errc() || end != raw.data() + raw.size() || raw.empty()) {
      throw ConfigError(where + " = '" + raw + "': expected an integer");
    }
    return v;
  }
  char* end = nullptr;
  const double v = std::strtod(raw.c_str(), &end);
  if (raw.empty() || end != raw.c_str() + raw.size()) {
    throw ConfigError(where + " = '" + raw + "': expected a number");
  }
  return v;
}

}  // namespace

const std::vector<SettingInfo>& settings() {
  static const std::vector<SettingInfo> infos = [] {
    std::vector<SettingInfo> v;
    for (const auto& s : table()) v.push_back(s.info);
    return v;
  }();
  return infos;
}

std::string flagName(const std::string& setting) {
  std::string f = "--" + setting;
  std::replace(f.begin(), f.end(), '_', '-');
  return f;
}

void applySettings(TrainConfig& config, const json& object, const std::string& origin) {
  if (!object.is_object()) {
    throw ConfigError(origin + ": expected a JSON object of settings, got " +
                      std::string(object.type_name()));
  }
  for (const auto& [key, value] : object.items()) {
    const Setting& s = findSetting(key, origin);
    s.apply(config, value, origin + ": " + key);
  }
}

void validate(const TrainConfig& c) {
  if (c.checkpoint_interval > 0 && c.checkpoint_dir.empty()) {
    throw ConfigError("checkpoint_interval = " + std::to_string(c.checkpoint_interval) +
                      " needs a checkpoint_dir (--checkpoint-dir DIR)");
  }
  if (c.train_limit > 0 && c.train_limit < c.batch_size) {
    throw ConfigError("train_limit = " + std::to_string(c.train_limit) +
                      " is smaller than one batch (batch_size = " + std::to_string(c.batch_size) +
                      ")");
  }
}

TrainConfig loadTrainConfig(const ConfigSources& sources, TrainConfig defaults) {
  TrainConfig config = std::move(defaults);
  if (!sources.file.empty()) {
    std::ifstream in(sources.file);
    if (!in) throw ConfigError("config file " + sources.file + " cannot be opened");
    json object;
    try {
      object = json::parse(in);
    } catch (const json::parse_error& e) {
      throw ConfigError("config file " + sources.file + " is not valid JSON: " + e.what());
    }
    applySettings(config, object, sources.file);
  }
  for (const auto& [name, raw] : sources.flags) {
    const std::string where = "flag " + flagName(name);
    const Setting& s = findSetting(name, where);
    s.apply(config, parseFlagValue(s, raw, where), where);
  }
  validate(config);
  return config;
}

json toJson(const TrainConfig& config) {
  json out = json::object();
  for (const auto& s : table()) out[s.info.name] = s.get(config);
  return out;
}

}  // namespace ddprun::trainers
