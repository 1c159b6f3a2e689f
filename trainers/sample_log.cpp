#include "trainers/sample_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/errors.h"

namespace ddprun::trainers {

SampleLog::SampleLog() {
  const char* path = std::getenv("DDPRUN_SAMPLE_LOG");
  if (path == nullptr || *path == '\0') return;
  fd_ = ::open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw ConfigError("DDPRUN_SAMPLE_LOG='" + std::string(path) + "' cannot be opened: " +
                      std::strerror(errno));
  }
}

SampleLog::~SampleLog() {
  if (fd_ >= 0) ::close(fd_);
}

void SampleLog::write(int generation, int64_t epoch, int64_t step, int rank, int world,
                      const std::vector<size_t>& indices) {
  if (fd_ < 0) return;
  std::string line = "g=" + std::to_string(generation) + " epoch=" + std::to_string(epoch) +
                     " step=" + std::to_string(step) + " rank=" + std::to_string(rank) +
                     " world=" + std::to_string(world) + " idx=";
  for (size_t i = 0; i < indices.size(); ++i) {
    if (i > 0) line += ',';
    line += std::to_string(indices[i]);
  }
  line += '\n';
  // One write: O_APPEND makes it land whole after every other rank's line.
  const ssize_t n = ::write(fd_, line.data(), line.size());
  if (n != static_cast<ssize_t>(line.size())) {
    throw ConfigError("DDPRUN_SAMPLE_LOG: writing a line failed: " +
                      std::string(n < 0 ? std::strerror(errno) : "short write"));
  }
}

}  // namespace ddprun::trainers
