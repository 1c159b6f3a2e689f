#pragma once
// RunDirectory: where a job keeps its per-worker files, in torchrun's layout:
//
//   <base>/attempt_<k>/<local_rank>/{stdout.log, stderr.log, error.json}
//
// With --log-dir DIR, base is DIR/<run_id>; if that exists already (a run id such as "none"
// is reused by every static job), DIR/<run_id>.1, .2, ... so no earlier job's logs are
// overwritten. Without --log-dir, base is a fresh temporary directory, removed at the end
// unless it holds logs the user asked for or the job failed (its error files are named in the
// failure report). k counts the starts of the worker group.
#include <cstdint>
#include <string>

namespace ddprun::launcher {

class RunDirectory {
 public:
  // Throws ConfigError naming the directory when it cannot be created.
  RunDirectory(const std::string& logDir, const std::string& runId);
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  const std::string& path() const { return base_; }
  bool temporary() const { return temporary_; }
  // Creates (if needed) and returns <base>/attempt_<attempt>/<localRank>.
  std::string workerDir(uint64_t attempt, int localRank) const;
  // Keep a temporary directory at exit (it holds redirected output, or a failed job's files).
  void keep() { keep_ = true; }

 private:
  std::string base_;
  bool temporary_ = false;
  bool keep_ = false;
};

}  // namespace ddprun::launcher
