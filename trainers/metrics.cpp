#include "trainers/metrics.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <vector>

#include "base/errors.h"

namespace ddprun::trainers {

MetricsFile::MetricsFile(std::string path, int64_t resumeStep) : path_(std::move(path)) {
  std::vector<std::string> kept;
  if (resumeStep >= 0) {
    std::ifstream in(path_);
    std::string line;
    while (std::getline(in, line)) {
      // Drop steps to be redone, and a line torn by a kill in mid-write; keep the rest.
      const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!record.is_object()) continue;
      if (record.contains("step") && record["step"].is_number_integer() &&
          record["step"].get<int64_t>() > resumeStep) {
        continue;
      }
      kept.push_back(line);
    }
  }
  const auto parent = std::filesystem::path(path_).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  out_.open(path_, std::ios::out | std::ios::trunc);
  if (!out_) throw ConfigError("metrics file " + path_ + " cannot be written");
  for (const auto& line : kept) out_ << line << '\n';
  out_.flush();
}

void MetricsFile::write(const nlohmann::json& record) {
  out_ << record.dump() << '\n';
  out_.flush();
}

std::string formatDuration(double seconds) {
  const auto total = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  char buf[32];
  if (total >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(total / 3600),
                  static_cast<long long>(total / 60 % 60), static_cast<long long>(total % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(total / 60),
                  static_cast<long long>(total % 60));
  }
  return buf;
}

std::string formatProgress(const Progress& p) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "epoch %lld/%lld  step %lld/%lld  loss %.4f  lr %.4g  %.0f samples/s  ETA %s",
                static_cast<long long>(p.epoch), static_cast<long long>(p.epochs),
                static_cast<long long>(p.step), static_cast<long long>(p.totalSteps), p.loss, p.lr,
                p.samplesPerSec, formatDuration(p.etaSeconds).c_str());
  return buf;
}

}  // namespace ddprun::trainers
