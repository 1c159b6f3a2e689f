#include "worker_runtime/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <vector>

#include "base/errors.h"

namespace ddprun::runtime::shm {
namespace {

constexpr uint64_t kMagic = 0x64647072756e7368ULL;  // "ddprunsh"
constexpr size_t kHeaderBytes = 128;
constexpr size_t kPage = 4096;

struct Header {
  uint64_t magic;
  uint64_t slotBytes;
  uint32_t ranks;
};
static_assert(sizeof(Header) <= kHeaderBytes);

std::string randomName(const std::string& prefix) {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw BackendError(std::string("shm: getrandom failed: ") + std::strerror(errno));
    got += static_cast<size_t>(n);
  }
  static const char* hex = "0123456789abcdef";
  std::string name = "/" + prefix + "-";
  for (unsigned char b : bytes) {
    name += hex[b >> 4];
    name += hex[b & 15];
  }
  return name;
}

size_t roundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

[[noreturn]] void fail(const std::string& what, const std::string& name, int err) {
  throw BackendError("shm: " + what + " of segment " + name + " failed: " + std::strerror(err));
}

}  // namespace

Segment::Segment(rendezvous::Store& store, const SegmentOptions& o)
    : rank_(o.rank), size_(o.size), slotBytes_(roundUp(o.slotBytes, kPage)) {
  DDPRUN_CHECK(size_ >= 1 && rank_ >= 0 && rank_ < size_, "rank " << rank_ << " of " << size_);
  if (o.namePrefix.empty() || o.namePrefix.size() > 64 ||
      o.namePrefix.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                     "0123456789_.-") != std::string::npos) {
    throw ConfigError("shm: segment name prefix '" + o.namePrefix +
                      "' is not valid: 1-64 characters of A-Z a-z 0-9 _ . -");
  }
  const size_t controlBytes = roundUp(sizeof(RankControl) * size_, kPage);
  bytes_ = kPage + controlBytes + 2 * static_cast<size_t>(size_) * slotBytes_;
  // Every path out of here before the name is unlinked unlinks it (a no-op once gone).
  struct Unlinker {
    std::string* name;
    ~Unlinker() {
      if (!name->empty()) ::shm_unlink(name->c_str());
    }
  } unlinker{&name_};
  int fd = -1;
  try {
    if (rank_ == 0) {
      name_ = randomName(o.namePrefix);
      fd = ::shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
      if (fd < 0) fail("shm_open (create)", name_, errno);
      if (::ftruncate(fd, static_cast<off_t>(bytes_)) != 0) fail("ftruncate", name_, errno);
      // Reserve the pages now: a full /dev/shm is a clear error here, not a SIGBUS mid-collective.
      if (const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes_)); err != 0) {
        throw BackendError("shm: cannot reserve " + std::to_string(bytes_ >> 20) +
                           " MiB in /dev/shm for segment " + name_ + ": " + std::strerror(err) +
                           " (is /dev/shm full or too small? DDPRUN_TRANSPORT=tcp avoids it)");
      }
    } else {
      name_ = store.get("name");
      fd = ::shm_open(name_.c_str(), O_RDWR | O_CLOEXEC, 0);
      if (fd < 0) {
        throw BackendError("shm: cannot open segment " + name_ + " created by local rank 0: " +
                           std::strerror(errno) + " (are all local ranks on one host?)");
      }
      struct stat st {};
      if (::fstat(fd, &st) != 0) fail("fstat", name_, errno);
      if (static_cast<size_t>(st.st_size) != bytes_) {
        throw BackendError("shm: segment " + name_ + " has " + std::to_string(st.st_size) +
                           " bytes, expected " + std::to_string(bytes_) +
                           " (ranks disagree on the slot size or rank count)");
      }
    }
    base_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base_ == MAP_FAILED) {
      base_ = nullptr;
      fail("mmap", name_, errno);
    }
    ::close(fd);
    fd = -1;
    auto* header = static_cast<Header*>(base_);
    control_ = reinterpret_cast<RankControl*>(static_cast<char*>(base_) + kPage);
    data_ = static_cast<char*>(base_) + kPage + controlBytes;
    if (rank_ == 0) {
      // The file is zero-filled: every counter starts at 0.
      for (int r = 0; r < size_; ++r) new (&control_[r]) RankControl{};
      header->slotBytes = slotBytes_;
      header->ranks = static_cast<uint32_t>(size_);
      std::atomic_thread_fence(std::memory_order_release);
      header->magic = kMagic;
      store.set("name", name_);
    } else if (header->magic != kMagic || header->ranks != static_cast<uint32_t>(size_) ||
               header->slotBytes != slotBytes_) {
      throw BackendError("shm: segment " + name_ + " does not match this communicator (" +
                         std::to_string(header->ranks) + " ranks, " +
                         std::to_string(header->slotBytes) + "-byte slots)");
    }
    control_[rank_].pid.store(static_cast<int32_t>(::getpid()));
    store.set("mapped/" + std::to_string(rank_), "1");
    std::vector<std::string> keys;
    for (int r = 0; r < size_; ++r) keys.push_back("mapped/" + std::to_string(r));
    store.wait(keys, o.timeout);
  } catch (...) {
    if (fd >= 0) ::close(fd);
    if (base_) ::munmap(base_, bytes_);
    base_ = nullptr;
    throw;
  }
  // Unlinker runs here: every rank has mapped the segment, the name can go.
}

Segment::~Segment() {
  if (base_) ::munmap(base_, bytes_);
}

}  // namespace ddprun::runtime::shm
