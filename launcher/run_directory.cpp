#include "launcher/run_directory.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "base/errors.h"
#include "base/log.h"

namespace ddprun::launcher {
namespace {

// True when it made the directory, false when it existed.
bool makeDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0) return true;
  if (errno != EEXIST) {
    throw ConfigError("cannot create directory " + path + ": " + std::strerror(errno));
  }
  return false;
}

}  // namespace

RunDirectory::RunDirectory(const std::string& logDir, const std::string& rawRunId) {
  std::string runId = rawRunId;  // a run id is a file name here: no '/' or leading '.'
  for (auto& c : runId) c = (c == '/') ? '_' : c;
  if (runId.empty() || runId[0] == '.') runId = "run" + runId;
  if (logDir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    const std::string parent = tmp && *tmp ? tmp : "/tmp";
    template_ = parent + "/ddprun-" + runId + "-XXXXXX";
    temporary_ = true;
    // Created at its first use; a parent it could not be made in is still refused now, before
    // the rendezvous (access(2) creates nothing).
    struct stat st {};
    int err = 0;
    if (::stat(parent.c_str(), &st) != 0) {
      err = errno;
    } else if (!S_ISDIR(st.st_mode)) {
      err = ENOTDIR;
    } else if (::access(parent.c_str(), W_OK | X_OK) != 0) {
      err = errno;
    }
    if (err != 0) {
      throw ConfigError("cannot create a temporary directory " + template_ + ": " +
                        std::strerror(err));
    }
    return;
  }
  std::error_code ec;
  std::filesystem::create_directories(logDir, ec);
  if (ec) throw ConfigError("--log-dir=" + logDir + ": cannot create it: " + ec.message());
  // mkdir is the atomic "claim": a name another job holds makes us try the next one.
  for (int n = 0; n < 10000; ++n) {
    std::string candidate = logDir + "/" + runId + (n == 0 ? "" : "." + std::to_string(n));
    if (::mkdir(candidate.c_str(), 0755) == 0) {
      base_ = candidate;
      if (n > 0) {
        DDPRUN_LOG(INFO, "launcher") << logDir << "/" << runId << " exists: logs go to "
                                     << candidate;
      }
      return;
    }
    if (errno != EEXIST) {
      throw ConfigError("--log-dir=" + logDir + ": cannot create " + candidate + ": " +
                        std::strerror(errno));
    }
  }
  throw ConfigError("--log-dir=" + logDir + ": too many runs named " + runId);
}

RunDirectory::~RunDirectory() {
  if (!temporary_ || base_.empty()) return;  // never created: nothing to keep or remove
  if (keep_ && holdsFiles()) {
    DDPRUN_LOG(INFO, "launcher") << "worker logs and error files are kept in " << base_;
    return;
  }
  removeTemporary();
}

bool RunDirectory::holdsFiles() const {
  if (base_.empty()) return false;
  std::error_code ec;
  std::filesystem::recursive_directory_iterator it(
      base_, std::filesystem::directory_options::skip_permission_denied, ec);
  if (ec) return ec != std::errc::no_such_file_or_directory;  // unreadable: kept, to be safe
  for (; it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) return true;  // a listing failed: kept, to be safe
    // Not followed: a symlink, even to a directory, is a file here.
    const auto type = it->symlink_status(ec).type();
    if (ec || type != std::filesystem::file_type::directory) return true;
  }
  return static_cast<bool>(ec);  // the last increment failed
}

void RunDirectory::removeTemporary() const {
  bool empty = true;
  for (auto d = made_.rbegin(); d != made_.rend() && empty; ++d) {
    empty = ::rmdir(d->c_str()) == 0 || errno == ENOENT;
  }
  if (empty && ::rmdir(base_.c_str()) == 0) return;
  std::error_code ec;  // files in it (a spare's, a replacement's, the progress table)
  std::filesystem::remove_all(base_, ec);
}

const std::string& RunDirectory::path() const {
  if (base_.empty()) {
    std::string tmpl = template_;
    if (::mkdtemp(tmpl.data()) == nullptr) {
      throw ConfigError("cannot create a temporary directory " + template_ + ": " +
                        std::strerror(errno));
    }
    base_ = tmpl;
  }
  return base_;
}

std::string RunDirectory::workerDir(uint64_t attempt, int localRank) const {
  const std::string attemptDir = path() + "/attempt_" + std::to_string(attempt);
  if (makeDir(attemptDir) && temporary_) made_.push_back(attemptDir);
  const std::string dir = attemptDir + "/" + std::to_string(localRank);
  if (makeDir(dir) && temporary_) made_.push_back(dir);
  return dir;
}

}  // namespace ddprun::launcher
