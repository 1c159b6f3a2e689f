#include "worker_runtime/shm/mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "base/errors.h"

namespace ddprun::runtime::shm {
namespace {

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

[[noreturn]] void fail(const std::string& call, const MappingOptions& o, const std::string& name,
                       int err) {
  throw BackendError("shm: " + call + " of " + o.what + " " + name + " failed: " +
                     std::strerror(err));
}

}  // namespace

SharedMapping::SharedMapping(rendezvous::Store& store, const MappingOptions& o,
                             const std::function<void(char*)>& initialize,
                             const std::function<void(char*)>& verify)
    : bytes_(o.bytes) {
  DDPRUN_CHECK(o.size >= 1 && o.rank >= 0 && o.rank < o.size, "rank " << o.rank << " of " << o.size);
  if (o.namePrefix.empty() || o.namePrefix.size() > 64 ||
      o.namePrefix.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                     "0123456789_.-") != std::string::npos) {
    throw ConfigError("shm: segment name prefix '" + o.namePrefix +
                      "' is not valid: 1-64 characters of A-Z a-z 0-9 _ . -");
  }
  // Every path out of here before the name is unlinked unlinks it (a no-op once gone).
  struct Unlinker {
    std::string* name;
    ~Unlinker() {
      if (!name->empty()) ::shm_unlink(name->c_str());
    }
  } unlinker{&name_};
  int fd = -1;
  // Set once this rank's outcome is in the store (the name, or "mapped/<rank>").
  bool published = false;
  try {
    if (o.rank == 0) {
      name_ = randomName(o.namePrefix);
      fd = ::shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
      if (fd < 0) fail("shm_open (create)", o, name_, errno);
      if (::ftruncate(fd, static_cast<off_t>(bytes_)) != 0) fail("ftruncate", o, name_, errno);
      // Reserve the pages now: a full /dev/shm is a clear error here, not a SIGBUS mid-collective.
      if (const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes_)); err != 0) {
        throw BackendError("shm: cannot reserve " + std::to_string(bytes_ >> 20) +
                           " MiB in /dev/shm for " + o.what + " " + name_ + ": " +
                           std::strerror(err) +
                           " (is /dev/shm full or too small? DDPRUN_TRANSPORT=tcp avoids it)");
      }
    } else {
      name_ = store.get("name");
      if (!name_.empty() && name_[0] == '!') {
        published = true;  // rank 0 failed: nothing to announce
        const std::string why = name_.substr(1);
        name_.clear();
        throw BackendError("shm: local rank 0 could not create the " + o.what + ": " + why);
      }
      fd = ::shm_open(name_.c_str(), O_RDWR | O_CLOEXEC, 0);
      if (fd < 0) {
        throw BackendError("shm: cannot open " + o.what + " " + name_ + " created by local rank 0: " +
                           std::strerror(errno) + " (are all local ranks on one host?)");
      }
      struct stat st {};
      if (::fstat(fd, &st) != 0) fail("fstat", o, name_, errno);
      if (static_cast<size_t>(st.st_size) != bytes_) {
        throw BackendError("shm: " + o.what + " " + name_ + " has " + std::to_string(st.st_size) +
                           " bytes, expected " + std::to_string(bytes_) +
                           " (ranks disagree on its size)");
      }
    }
    // MAP_POPULATE: the page table is filled here in one call, not by a fault per page at the
    // first collectives. Where faults are dear (a virtual machine with shadow page tables: ~15 us
    // each; docs/recovery.md, stop 53) that was most of a re-form's heal broadcast.
    base_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (base_ == MAP_FAILED) {
      base_ = nullptr;
      fail("mmap", o, name_, errno);
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) fail("fstat", o, name_, errno);
    identity_ = {.device = static_cast<uint64_t>(st.st_dev), .inode = static_cast<uint64_t>(st.st_ino)};
    if (o.keepFd) {
      fd_ = fd;
    } else {
      ::close(fd);
    }
    fd = -1;
    if (o.rank == 0) {
      if (initialize) initialize(data());
      store.set("name", name_);
    } else if (verify) {
      verify(data());
    }
    published = true;
    store.set("mapped/" + std::to_string(o.rank), "1");
    std::vector<std::string> keys;
    for (int r = 0; r < o.size; ++r) keys.push_back("mapped/" + std::to_string(r));
    store.wait(keys, o.timeout);
    const std::vector<std::string> values = store.multiGet(keys);
    for (int r = 0; r < o.size; ++r) {
      if (!values[r].empty() && values[r][0] == '!') {
        throw BackendError("shm: local rank " + std::to_string(r) + " could not map the " + o.what +
                           ": " + values[r].substr(1));
      }
    }
  } catch (const std::exception& e) {
    if (!published) {
      try {  // tell the others, so that they fail now rather than at the timeout
        store.set(o.rank == 0 ? "name" : "mapped/" + std::to_string(o.rank),
                  std::string("!") + e.what());
      } catch (...) {
      }
    }
    if (fd >= 0) ::close(fd);
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (base_) ::munmap(base_, bytes_);
    base_ = nullptr;
    throw;
  }
  // Unlinker runs here: every rank has mapped the memory, the name can go.
}

SharedMapping::SharedMapping(const std::string& procPath, size_t bytes,
                             const FileIdentity& expected, const std::string& what, bool keepFd)
    : name_(procPath), bytes_(bytes) {
  auto failWith = [&](const std::string& why) {
    throw BackendError("shm: cannot map the " + what + " held open as " + procPath + ": " + why);
  };
  const int fd = ::open(procPath.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) failWith(std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    failWith(std::string("fstat: ") + std::strerror(err));
  }
  identity_ = {.device = static_cast<uint64_t>(st.st_dev), .inode = static_cast<uint64_t>(st.st_ino)};
  if (!(identity_ == expected) || !S_ISREG(st.st_mode) || static_cast<size_t>(st.st_size) != bytes) {
    ::close(fd);
    failWith("it is another file now (device " + std::to_string(identity_.device) + ", inode " +
             std::to_string(identity_.inode) + ", " + std::to_string(st.st_size) + " bytes; " +
             "expected inode " + std::to_string(expected.inode) + ", " + std::to_string(bytes) +
             " bytes)");
  }
  // Every shared mapping's name is unlinked once all ranks mapped it: a file that still has one
  // (a checkpoint being written, say) is none of ours, whatever an offer in the store says.
  if (st.st_nlink != 0) {
    ::close(fd);
    failWith("it is a file with a name (" + std::to_string(st.st_nlink) + " link(s)), not a "
             "shared buffer of the job");
  }
  base_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base_ == MAP_FAILED) {
    const int err = errno;
    base_ = nullptr;
    ::close(fd);
    failWith(std::string("mmap: ") + std::strerror(err));
  }
  if (keepFd) {
    fd_ = fd;
  } else {
    ::close(fd);
  }
}

SharedMapping::~SharedMapping() {
  if (base_) ::munmap(base_, bytes_);
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace ddprun::runtime::shm
