#include "base/progress_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <system_error>
#include <thread>

#include "base/errors.h"
#include "base/log.h"

namespace ddprun::progress {

void createProgressFile(const std::string& path, uint32_t heartbeatPeriodMs) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("progress file " + path + ": " + std::strerror(errno));
  uint64_t words[kProgressFileSize / 8] = {kProgressMagic, 0, 0, heartbeatPeriodMs};
  const ssize_t n = ::write(fd, words, sizeof words);
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(sizeof words)) {
    throw Error("progress file " + path + ": " + (n < 0 ? std::strerror(err) : "short write"));
  }
}

std::optional<ProgressSample> readProgressFile(int fd) {
  uint64_t words[kProgressFileSize / 8] = {};
  if (::pread(fd, words, sizeof words, 0) != static_cast<ssize_t>(sizeof words)) return {};
  if (words[0] != kProgressMagic) return {};
  return ProgressSample{.steps = words[1], .waiting = words[2],
                        .heartbeats = words[3] / kHeartbeatBeat};
}

ProgressWriter& ProgressWriter::instance() {
  static ProgressWriter writer([] {
    const char* p = std::getenv(kProgressFileEnv);
    return std::string(p ? p : "");
  }());
  return writer;
}

ProgressWriter::ProgressWriter(const std::string& path) {
  if (path.empty()) return;
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    DDPRUN_LOG(DEBUG, "runtime") << "progress file " << path << ": " << std::strerror(errno)
                                 << "; progress is not reported";
    return;
  }
  struct stat st {};
  void* map = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && st.st_size >= static_cast<off_t>(kProgressFileSize)) {
    map = ::mmap(nullptr, kProgressFileSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  ::close(fd);  // the mapping stays valid
  if (map == MAP_FAILED) {
    DDPRUN_LOG(DEBUG, "runtime") << "progress file " << path << " cannot be mapped; "
                                 << "progress is not reported";
    return;
  }
  auto* words = static_cast<uint64_t*>(map);
  if (__atomic_load_n(&words[0], __ATOMIC_RELAXED) != kProgressMagic) {
    ::munmap(map, kProgressFileSize);
    DDPRUN_LOG(DEBUG, "runtime") << "progress file " << path << " is not one; not reported";
    return;
  }
  words_ = words;
}

ProgressWriter::~ProgressWriter() {
  // A heartbeat thread uses the mapping until the process ends: it stays mapped then.
  if (words_ && !beating_.load()) ::munmap(words_, kProgressFileSize);
}

uint32_t ProgressWriter::startHeartbeat() {
  if (!words_) return 0;
  const auto periodMs =
      static_cast<uint32_t>(__atomic_load_n(&words_[3], __ATOMIC_RELAXED) & kHeartbeatPeriodMask);
  if (periodMs == 0) return 0;
  if (beating_.exchange(true)) return periodMs;
  uint64_t* word = &words_[3];
  try {
    // The first beat announces the heartbeat: the agent watches it from then on.
    std::thread([word, periodMs] {
      const timespec period{static_cast<time_t>(periodMs / 1000),
                            static_cast<long>(periodMs % 1000) * 1'000'000L};
      for (;;) {
        __atomic_fetch_add(word, kHeartbeatBeat, __ATOMIC_RELAXED);
        ::nanosleep(&period, nullptr);
      }
    }).detach();
  } catch (const std::system_error& e) {
    // No thread (out of resources): nothing announced, so the worker is not watched for freezes.
    beating_ = false;
    DDPRUN_LOG(WARN, "runtime") << "no heartbeat thread (" << e.what()
                                << "): ddprun cannot tell this worker frozen from slow";
    return 0;
  }
  return periodMs;
}

void ProgressWriter::step() {
  if (words_) __atomic_fetch_add(&words_[1], 1, __ATOMIC_RELAXED);
}
void ProgressWriter::enterWait() {
  if (words_) __atomic_fetch_add(&words_[2], 1, __ATOMIC_RELAXED);
}
void ProgressWriter::leaveWait() {
  if (words_) __atomic_fetch_sub(&words_[2], 1, __ATOMIC_RELAXED);
}

}  // namespace ddprun::progress
