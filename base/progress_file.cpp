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
#include <vector>

#include "base/errors.h"
#include "base/log.h"

namespace ddprun::progress {

namespace {

// `slots` fresh records: the magic, zero counters, the heartbeat period.
std::vector<uint64_t> freshRecords(int slots, uint32_t heartbeatPeriodMs) {
  std::vector<uint64_t> words(static_cast<size_t>(slots) * kProgressRecordSize / 8, 0);
  for (size_t i = 0; i < words.size(); i += kProgressRecordSize / 8) {
    words[i] = kProgressMagic;
    words[i + 3] = heartbeatPeriodMs;
  }
  return words;
}

void writeRecords(int fd, const std::vector<uint64_t>& words, off_t at, const std::string& path) {
  const size_t bytes = words.size() * 8;
  const ssize_t n = ::pwrite(fd, words.data(), bytes, at);
  if (n != static_cast<ssize_t>(bytes)) {
    throw Error("progress file " + path + ": " + (n < 0 ? std::strerror(errno) : "short write"));
  }
}

}  // namespace

void writeProgressTable(const std::string& path, int slots, uint32_t heartbeatPeriodMs) {
  DDPRUN_CHECK(slots > 0 && slots <= kMaxProgressSlots, "progress table slots out of range");
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!fd) throw Error("progress file " + path + ": " + std::strerror(errno));
  writeRecords(fd.get(), freshRecords(slots, heartbeatPeriodMs), 0, path);
}

void resetProgressRecord(const std::string& path, int slot, uint32_t heartbeatPeriodMs) {
  DDPRUN_CHECK(slot >= 0 && slot < kMaxProgressSlots, "progress record out of range");
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) throw Error("progress file " + path + ": " + std::strerror(errno));
  writeRecords(fd.get(), freshRecords(1, heartbeatPeriodMs),
               static_cast<off_t>(slot) * kProgressRecordSize, path);
}

ProgressTable::ProgressTable(const std::function<std::string()>& fallbackPath) {
  fd_.reset(::memfd_create("ddprun-progress", MFD_CLOEXEC));
  if (fd_) {
    path_ = "/proc/" + std::to_string(::getpid()) + "/fd/" + std::to_string(fd_.get());
    // The workers open it by that name: /proc must show it (and let this process open it).
    if (::access(path_.c_str(), R_OK | W_OK) == 0) return;
    fd_.reset();
  }
  path_ = fallbackPath();
  fd_.reset(::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!fd_) throw Error("progress file " + path_ + ": " + std::strerror(errno));
}

void ProgressTable::write(int slots, uint32_t heartbeatPeriodMs) {
  DDPRUN_CHECK(slots > 0 && slots <= kMaxProgressSlots, "progress table slots out of range");
  writeRecords(fd_.get(), freshRecords(slots, heartbeatPeriodMs), 0, path_);
}

void ProgressTable::reset(int slot, uint32_t heartbeatPeriodMs) {
  DDPRUN_CHECK(slot >= 0 && slot < kMaxProgressSlots, "progress record out of range");
  writeRecords(fd_.get(), freshRecords(1, heartbeatPeriodMs),
               static_cast<off_t>(slot) * kProgressRecordSize, path_);
}

std::optional<ProgressSample> readProgressRecord(int fd, int slot) {
  if (slot < 0 || slot >= kMaxProgressSlots) return {};
  uint64_t words[kProgressRecordSize / 8] = {};
  const off_t at = static_cast<off_t>(slot) * kProgressRecordSize;
  if (::pread(fd, words, sizeof words, at) != static_cast<ssize_t>(sizeof words)) return {};
  if (words[0] != kProgressMagic) return {};
  return ProgressSample{.steps = words[1], .waiting = words[2],
                        .heartbeats = words[3] / kHeartbeatBeat};
}

namespace {
std::atomic<int> holds{0};
}  // namespace

ProgressHold::ProgressHold() { holds.fetch_add(1, std::memory_order_acq_rel); }
ProgressHold::~ProgressHold() { holds.fetch_sub(1, std::memory_order_acq_rel); }

ProgressWriter& ProgressWriter::instance() {
  if (holds.load(std::memory_order_acquire) > 0) {
    static ProgressWriter none("", -1);
    return none;
  }
  static ProgressWriter writer(
      [] {
        const char* p = std::getenv(kProgressFileEnv);
        return std::string(p ? p : "");
      }(),
      [] {
        const char* s = std::getenv(kProgressSlotEnv);
        if (s == nullptr) return 0;
        char* end = nullptr;
        const long v = std::strtol(s, &end, 10);
        return end != s && *end == '\0' && v >= 0 && v < kMaxProgressSlots ? static_cast<int>(v)
                                                                           : -1;
      }());
  return writer;
}

ProgressWriter::ProgressWriter(const std::string& path, int slot) {
  if (path.empty()) return;
  if (slot < 0 || slot >= kMaxProgressSlots) {
    DDPRUN_LOG(DEBUG, "runtime") << kProgressSlotEnv << " is not a slot number; progress is "
                                 << "not reported";
    return;
  }
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    DDPRUN_LOG(DEBUG, "runtime") << "progress file " << path << ": " << std::strerror(errno)
                                 << "; progress is not reported";
    return;
  }
  const size_t end = (static_cast<size_t>(slot) + 1) * kProgressRecordSize;
  struct stat st {};
  void* map = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= static_cast<off_t>(end)) {
    map = ::mmap(nullptr, end, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  ::close(fd);  // the mapping stays valid
  if (map == MAP_FAILED) {
    DDPRUN_LOG(DEBUG, "runtime") << "progress file " << path << " has no record " << slot
                                 << " that can be mapped; progress is not reported";
    return;
  }
  auto* words = reinterpret_cast<uint64_t*>(static_cast<char*>(map) + end - kProgressRecordSize);
  if (__atomic_load_n(&words[0], __ATOMIC_RELAXED) != kProgressMagic) {
    ::munmap(map, end);
    DDPRUN_LOG(DEBUG, "runtime") << "progress file " << path << " is not one; not reported";
    return;
  }
  map_ = map;
  mapBytes_ = end;
  words_ = words;
}

ProgressWriter::~ProgressWriter() {
  // A heartbeat thread uses the mapping until the process ends: it stays mapped then.
  if (map_ && !beating_.load()) ::munmap(map_, mapBytes_);
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
