#pragma once
// SampleLog: which dataset indices each rank trains on, step by step, for tests and for anyone
// checking that a job saw every sample of an epoch exactly once (docs/recovery.md#shrink).
//
// Off unless DDPRUN_SAMPLE_LOG names a file. Every rank appends one line per optimizer step,
// written before the step's collectives start (so a step whose gradients reached the others is
// always in the file, even when its rank was SIGKILLed right after):
//   g=<generation> epoch=<e> step=<s> rank=<r> world=<w> idx=<i>,<i>,...
// `step` is the step being taken (1-based). A step can appear more than once: an in-process
// recovery rolls back to the last commit and a later generation takes the steps after it
// again; the record of a step is the lines of its highest generation (one per rank of it).
// Each line is one write(2) on an O_APPEND descriptor, so ranks never interleave within a line;
// a process killed mid-write may leave a torn last line, which readers skip. Throws ConfigError
// when the file cannot be opened.
#include <cstdint>
#include <string>
#include <vector>

namespace ddprun::trainers {

class SampleLog {
 public:
  // From the environment: off when DDPRUN_SAMPLE_LOG is unset or empty.
  SampleLog();
  ~SampleLog();
  SampleLog(const SampleLog&) = delete;
  SampleLog& operator=(const SampleLog&) = delete;

  bool on() const { return fd_ >= 0; }
  void write(int generation, int64_t epoch, int64_t step, int rank, int world,
             const std::vector<size_t>& indices);

 private:
  int fd_ = -1;
};

}  // namespace ddprun::trainers
