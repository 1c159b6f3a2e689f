#pragma once
// What travels between the local ddprun of an ssh launch and each remote agent, besides the
// command line (which carries flags and PROGRAM only, never a secret):
//
//   local -> remote, on the agent's stdin:
//     the environment block: "DDPRUN-ENV\n" then NAME=VALUE entries each ended by '\0', then
//     one more '\0'; afterwards, one command a line: "signal N" (act as if signal N arrived).
//     EOF on stdin means the launcher or its connection is gone: the agent acts as on SIGHUP.
//   remote -> local, on the agent's stderr, among its log lines:
//     records, whole lines starting with '\x1f' (no worker line can: the agent prefixes
//     every worker line with "[node N rank R]: "):
//       "\x1f" "started"                  the agent runs (stderr before it is ssh's)
//       "\x1f" "store PORT"               the store host bound the rendezvous store on PORT
//       "\x1f" "root-cause RANK CODE TEXT"  a worker of this node is the job's root cause
//
// Pure functions: encoding, decoding, the exported environment, shell quoting.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/options.h"

namespace ddprun::launcher::cluster {

inline constexpr char kRecordMark = '\x1f';

// The variables that travel by default: NCCL_*, DDPRUN_*, PYTHONPATH, PYTHON_EXEC,
// OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES.
bool exportedByDefault(const std::string& name);

// The default set plus --export VAR (its value here; PREFIX* for every variable that starts
// with PREFIX) and --export VAR=VALUE. Throws ConfigError for a malformed --export or a VAR
// that is not set here.
Environment exportedEnvironment(const Environment& local, const std::vector<std::string>& exports);

std::string encodeEnvBlock(const Environment& env);

// Incremental decoder of the block: feed() bytes until it returns true; `rest()` holds the
// bytes after the block (the first commands). Throws ProtocolError on a malformed block.
class EnvBlockDecoder {
 public:
  bool feed(std::string_view bytes);
  const Environment& environment() const { return env_; }
  const std::string& rest() const { return rest_; }

 private:
  bool header_ = false, done_ = false;
  std::string buf_, rest_;
  Environment env_;
};

struct Record {
  enum class Kind { Started, Store, RootCause };
  Kind kind;
  int port = 0;              // Store
  int rank = 0, code = 0;    // RootCause
  std::string text;          // RootCause: what failed
};
std::string formatRecord(const Record& r);  // with the mark, without '\n'
// nullopt for a line that is not a record (or a malformed one).
std::optional<Record> parseRecord(std::string_view line);

// A command on the agent's stdin: "signal N" -> N; nullopt otherwise.
std::optional<int> parseCommand(std::string_view line);

// 'text' for a POSIX shell (single quotes, ' as '\'').
std::string shellQuote(const std::string& text);
// The remote command: cd to `dir` (when it exists there) and exec `argv` in the login shell.
std::string remoteCommandLine(const std::string& dir, const std::vector<std::string>& argv);

}  // namespace ddprun::launcher::cluster
