#pragma once
// RunDirectory: where a job keeps its per-worker files, in torchrun's layout:
//
//   <base>/attempt_<k>/<local_rank>/{stdout.log, stderr.log, error.json}
//
// With --log-dir DIR, base is DIR/<run_id>; if that exists already (a run id such as "none"
// is reused by every static job), DIR/<run_id>.1, .2, ... so no earlier job's logs are
// overwritten. Without --log-dir, base is a fresh temporary directory, removed at the end
// unless it holds logs the user asked for or the job failed (its error files are named in the
// failure report); a failed job's directory that holds no file at all (workers that wrote no
// error file, a job interrupted with Ctrl-C) is removed too: on a cluster every node's agent
// would otherwise leave an empty tree in /tmp per failed job. k counts the starts of the
// worker group.
//
// A temporary base is created at its first use (path() or workerDir(), when the first workers
// start), not when the agent starts: a node's rendezvous creates nothing on disk, and an agent
// whose workers never start leaves nothing behind. On ext4 an inode created within 30 s of
// deletions in its block group scans the recently deleted inodes (docs/rendezvous.md, "What an
// agent process costs"): 256 agents starting together paid that while they joined.
#include <cstdint>
#include <string>
#include <vector>

namespace ddprun::launcher {

class RunDirectory {
 public:
  // Throws ConfigError naming the directory when it cannot be created (for a temporary one:
  // when its parent, $TMPDIR or /tmp, is not a writable directory).
  RunDirectory(const std::string& logDir, const std::string& runId);
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  // The base directory, created now if it is a temporary one not made yet (ConfigError if
  // that fails).
  const std::string& path() const;
  bool temporary() const { return temporary_; }
  // Creates (if needed) and returns <base>/attempt_<attempt>/<localRank>.
  std::string workerDir(uint64_t attempt, int localRank) const;
  // Keep a temporary directory at exit (it holds redirected output, or a failed job's files),
  // if by then it holds a file: an empty tree is removed all the same.
  void keep() { keep_ = true; }
  // Whether a directory made and not yet removed holds a file (anything but a directory)
  // anywhere below it: what a kept directory would be kept for.
  bool holdsFiles() const;

 private:
  void removeTemporary() const;

  mutable std::string base_;  // empty until a temporary directory is created
  std::string template_;      // a temporary directory's mkdtemp template
  bool temporary_ = false;
  bool keep_ = false;
  // The directories under a temporary base that workerDir() created, in order: at the end they
  // go with one rmdir each, deepest first (remove_all, which lists and opens each one, only
  // when something else is in them).
  mutable std::vector<std::string> made_;
};

}  // namespace ddprun::launcher
