#pragma once
// What a training run reports: progress lines for people (rank 0's stdout) and a JSON-lines
// metrics file for plots (--metrics FILE).
//
// Metrics records, one JSON object per line, each with "kind":
//   {"kind":"config", ...settings, "world_size"}           once per start (attempt)
//   {"kind":"train", "epoch","step","loss","lr","samples_per_sec","elapsed_s"}  every log interval
//   {"kind":"eval", "epoch","step","test_loss","test_accuracy"}                  after each epoch
//   {"kind":"summary", "steps","samples","train_seconds","samples_per_sec","final_loss",
//    "test_accuracy"}                                                            at the end
// "epoch" counts from 1 in records and progress lines.
#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace ddprun::trainers {

class MetricsFile {
 public:
  // resumeStep < 0: a fresh run; the file is truncated. resumeStep >= 0: the run resumes from a
  // checkpoint of that step; records with a larger "step" (written by an attempt that died after
  // its last checkpoint, and about to be redone) are dropped, so the file never shows a step
  // twice; so is a last line torn by a kill in mid-write. Throws ConfigError when the file cannot
  // be written.
  MetricsFile(std::string path, int64_t resumeStep);

  // Appends one record and flushes it, so a crash loses nothing already written.
  void write(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

// One progress line's content.
struct Progress {
  int64_t epoch = 1;  // 1-based
  int64_t epochs = 1;
  int64_t step = 0;  // optimizer steps done
  int64_t totalSteps = 0;
  double loss = 0;
  double lr = 0;
  double samplesPerSec = 0;
  double etaSeconds = 0;
};

// "epoch 1/4  step 200/1872  loss 0.5231  lr 0.0498  9812 samples/s  ETA 0:33"
std::string formatProgress(const Progress& p);

// Seconds as "m:ss" (or "h:mm:ss" from one hour).
std::string formatDuration(double seconds);

// A monotonic stopwatch in seconds.
class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  void restart() { start_ = std::chrono::steady_clock::now(); }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace ddprun::trainers
