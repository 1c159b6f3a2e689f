#pragma once
// LentCarry: a rank's lent buffers (Communicator::lendSharedBuffer, DDP's buckets) kept from one
// generation of in-process recovery to the next.
//
// Why: every generation has a new communicator, and DDP, rebuilt on it, lends its buckets again.
// A new mapping's pages are first touched by the next allreduces, on every rank, and each first
// touch costs 5-10 us on a guest with shadow page tables: at 4 ranks each rank maps every rank's
// region (in-place reduce), 4 x 1,600 pages for mnist_mlp, most of a recovery's first steps. The
// survivors already hold the previous generation's buffer, mapped and touched; only the process
// that takes the dead rank needs to map it.
//
// How: when a lent tensor is freed (the old DDP destroyed), its mapping goes into this process's
// carry under its lend number instead of being unmapped. The k-th lend of a later generation's
// communicator (ShmOptions::reuseLent) first asks every rank what it carries for k (round
// "offer"): when every rank that carries one carries the same memory, of at least the size
// asked (a shrunk group keeps its larger buffer for when it grows back), those ranks use it as
// it is and the others open it through the lowest such rank's /proc/<pid>/fd/<fd> (checked by
// device, inode, no name left and the pid in the segment; round "opened");
// then every rank checks, through its own mapping, the random value each rank wrote at the start
// of its region (round "checked"). The offers go through the store (the replacement reads them
// there); rounds "opened" and "checked" are an allgather of each rank's status through the
// generation's segment, with none of the store's round trips. Should anything fail on any
// rank, every rank maps a new buffer as before. The carry holds at most one mapping per lend
// number, and only the newest.
// (The store is not trusted with the memory: ShmCommunicator::reuseCarried, docs/security.md.)
//
// Safety: a carried buffer is used only once its tensor was freed, so no job of the old
// communicator holds it; the dead rank's process is gone (killed by its agent) before a
// generation forms, so nobody of the old generation writes into it; DDP writes every bucket
// before each allreduce, so what the old generation left there (and the check values written
// at the start of each region) is never read.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "worker_runtime/shm/mapping.h"

namespace ddprun::runtime::shm {

class LentCarry {
 public:
  // `mapping` has its descriptor open (MappingOptions::keepFd). take() returns null when
  // nothing is kept for `lend`. Thread-safe: a tensor's deleter may run on any thread.
  void keep(int lend, std::shared_ptr<SharedMapping> mapping);
  std::shared_ptr<SharedMapping> take(int lend);

 private:
  std::mutex mutex_;
  std::map<int, std::shared_ptr<SharedMapping>> kept_;
};

// What a rank says it carries for a lend: its offer in the store, "-" for nothing, else
// "<device> <inode> <bytes> <pid> <fd>".
struct LentOffer {
  FileIdentity file;
  size_t bytes = 0;
  int64_t pid = 0;
  int fd = -1;
};
std::string formatOffer(const std::optional<LentOffer>& offer);
// Throws BackendError naming the text when it is neither "-" nor a well-formed offer.
std::optional<LentOffer> parseOffer(const std::string& text);

// Every rank's offers (index = local rank) -> the rank whose memory the group reuses, or nothing
// (no rank carries any, they carry different memories, or one smaller than `bytes`). A larger
// one is reused whole: a group that shrank keeps the buffer of its former size (its regions past
// the new world size unused), which fits again when the group grows back. The same on every
// rank: it depends on the offers alone.
std::optional<int> chooseCarried(const std::vector<std::optional<LentOffer>>& offers, size_t bytes);

}  // namespace ddprun::runtime::shm
