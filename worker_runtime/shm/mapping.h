#pragma once
// SharedMapping: one piece of shared memory mapped by every rank of a node, set up through the
// store. The lifetime rules of the shm transport live here, once (Segment and the lent buffers of
// Communicator::lendSharedBuffer both use it):
//   - local rank 0 creates it with shm_open under a random, unguessable name (128 bits from
//     getrandom, O_CREAT|O_EXCL, mode 0600), reserves its pages (posix_fallocate: a full /dev/shm
//     is an error here rather than a SIGBUS later), maps it, lets `initialize` fill it, and
//     publishes the name in the store under "name";
//   - every other rank reads the name, opens and maps it, lets `verify` check it, and announces
//     that under "mapped/<rank>";
//   - once every rank has mapped it, every rank unlinks the name (the first one succeeds): from
//     then on the memory lives only in the mappings and goes away with the last process, whatever
//     way it exits. Every failure path before that unlinks too.
// A rank that fails publishes why instead ("!" + the message, as the name or as its "mapped"
// value), so the others throw the same BackendError at once instead of waiting for the timeout:
// all ranks succeed together or all throw.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "rendezvous/store.h"

namespace ddprun::runtime::shm {

struct MappingOptions {
  int rank = 0;  // local rank; 0 creates the memory
  int size = 1;  // local world size
  size_t bytes = 0;
  // The name is "/<namePrefix>-<32 random hex digits>"; [A-Za-z0-9_.-], at most 64 characters.
  std::string namePrefix = "ddprun";
  std::chrono::milliseconds timeout{300'000};  // bound of the store waits
  std::string what = "segment";                // names the memory in messages
  // The descriptor stays open (fd()), so that another process of this user can map the same
  // memory through /proc/<pid>/fd/<fd> once the name is gone (lent buffers kept across
  // generations: lent_carry.h).
  bool keepFd = false;
};

// Which file a descriptor refers to: what a process that opens another's /proc/<pid>/fd/<fd>
// checks (the pid may have been reused, the descriptor number too).
struct FileIdentity {
  uint64_t device = 0;
  uint64_t inode = 0;
  bool operator==(const FileIdentity&) const = default;
};

class SharedMapping {
 public:
  // `store`'s keys must be private to this mapping (a scoped store). `initialize` runs on rank 0
  // before the name is published, `verify` on the others once mapped (it throws BackendError when
  // the memory does not match). Throws BackendError (shm_open, mmap or space failures, naming the
  // call and errno, or the failure of another rank) or TimeoutError (a rank never came).
  SharedMapping(rendezvous::Store& store, const MappingOptions& options,
                const std::function<void(char*)>& initialize = {},
                const std::function<void(char*)>& verify = {});
  // Maps memory another process of this node holds open, by its /proc/<pid>/fd/<fd> path: the
  // file must be `expected`, hold `bytes` and have no name left (as every mapping of the first
  // kind, once all ranks mapped it). No store, no unlink. Throws BackendError naming the path and
  // why (gone, not permitted, another file, another size, a file with a name).
  SharedMapping(const std::string& procPath, size_t bytes, const FileIdentity& expected,
                const std::string& what, bool keepFd);
  ~SharedMapping();
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;

  char* data() const { return static_cast<char*>(base_); }
  size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }
  int fd() const { return fd_; }  // -1 unless MappingOptions::keepFd
  const FileIdentity& identity() const { return identity_; }

 private:
  std::string name_;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  int fd_ = -1;
  FileIdentity identity_;
};

}  // namespace ddprun::runtime::shm
