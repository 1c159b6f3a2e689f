#include "worker_runtime/shm/collectives.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include <c10/util/typeid.h>

#include "base/errors.h"
#include "worker_runtime/reduce.h"

namespace ddprun::runtime::shm {

namespace {

// The P input (or output) pointers of one reduction: on the stack up to 64 ranks (no allocation
// on the hot path), on the heap beyond.
template <typename Pointer>
class PointerList {
 public:
  explicit PointerList(int n) {
    if (n > kInline) heap_.resize(static_cast<size_t>(n));
  }
  Pointer* data() { return heap_.empty() ? inline_ : heap_.data(); }

 private:
  static constexpr int kInline = 64;
  Pointer inline_[kInline];
  std::vector<Pointer> heap_;
};
using InputList = PointerList<const void*>;
using OutputList = PointerList<void*>;

}  // namespace

Collectives::Collectives(Segment& segment, CollectiveOptions options)
    : segment_(segment),
      options_(options),
      sync_(segment.control(), segment.rank(), segment.size(), options.sync) {}

void Collectives::allreduce(void* data, size_t count, c10::ScalarType type, ReduceOp op,
                            Clock::time_point deadline) {
  if (count == 0 || size() == 1) return;
  sync_.checkPeers();
  const size_t es = c10::elementSize(type);
  const bool stream = streams(count * es);
  if (!lent_.empty() && count * es > options_.directMaxBytes &&
      allreduceInPlace(static_cast<char*>(data), count, type, op, stream, deadline)) {
    inPlace_.fetch_add(count * es, std::memory_order_relaxed);
    return;
  }
  staged_.fetch_add(count * es, std::memory_order_relaxed);
  const size_t chunkCount = segment_.slotBytes() / es;
  auto* bytes = static_cast<char*>(data);
  for (size_t done = 0; done < count; done += chunkCount) {
    const size_t m = std::min(chunkCount, count - done);
    if (m * es <= options_.directMaxBytes) {
      allreduceDirect(bytes + done * es, m, type, op, deadline);
    } else {
      allreduceScatterGather(bytes + done * es, m, type, op, stream, deadline);
    }
  }
}

void Collectives::allreduceDirect(char* data, size_t count, c10::ScalarType type, ReduceOp op,
                                  Clock::time_point deadline) {
  const int P = size();
  const int parity = nextParity();
  const size_t n = count * c10::elementSize(type);
  std::memcpy(segment_.slot(parity, rank()), data, n);
  phase(deadline);
  InputList list(P);
  const void** inputs = list.data();
  // Ours read in place (the same bytes as our slot's).
  for (int j = 0; j < P; ++j) inputs[j] = j == rank() ? data : segment_.slot(parity, j);
  void* const out[1] = {data};
  reduceManyTo(out, 1, inputs, P, count, type, op == ReduceOp::Avg ? ReduceOp::Sum : op,
               op == ReduceOp::Avg ? P : 1);
}

void Collectives::allreduceScatterGather(char* data, size_t count, c10::ScalarType type,
                                         ReduceOp op, bool stream, Clock::time_point deadline) {
  const int P = size();
  const int r = rank();
  const int parity = nextParity();
  const size_t es = c10::elementSize(type);
  // Slices of whole cache lines (the last ones may be short or empty).
  const size_t line = std::max<size_t>(1, 64 / es);
  const size_t slice = ((count + P - 1) / P + line - 1) / line * line;
  auto lo = [&](int j) { return std::min(count, slice * j); };
  auto hi = [&](int j) { return std::min(count, slice * (j + 1)); };
  char* mine = segment_.slot(parity, r);
  // The parts the others own; our own slice is read in place.
  copyOut(mine, data, lo(r) * es, stream);
  copyOut(mine + hi(r) * es, data + hi(r) * es, (count - hi(r)) * es, stream);
  phase(deadline);
  if (const size_t len = hi(r) - lo(r); len > 0) {
    InputList list(P);
    const void** inputs = list.data();
    for (int j = 0; j < P; ++j) {
      inputs[j] = (j == r ? data : segment_.slot(parity, j)) + lo(r) * es;
    }
    // Into our buffer and our slot (for the peers), in one pass.
    void* const outputs[2] = {data + lo(r) * es, mine + lo(r) * es};
    reduceManyTo(outputs, 2, inputs, P, len, type, op == ReduceOp::Avg ? ReduceOp::Sum : op,
                 op == ReduceOp::Avg ? P : 1, stream ? 1 : -1);
  }
  phase(deadline);
  for (int j = 0; j < P; ++j) {
    if (j == r) continue;
    std::memcpy(data + lo(j) * es, segment_.slot(parity, j) + lo(j) * es, (hi(j) - lo(j)) * es);
  }
}

void Collectives::copyOut(char* slot, const void* from, size_t bytes, bool stream) {
  if (stream) {
    streamCopy(slot, from, bytes);
  } else {
    std::memcpy(slot, from, bytes);
  }
}

void Collectives::addLent(const std::shared_ptr<SharedMapping>& mapping, size_t regionBytes) {
  lent_.push_back({mapping, regionBytes});
}

bool Collectives::allreduceInPlace(char* data, size_t count, c10::ScalarType type, ReduceOp op,
                                   bool stream, Clock::time_point deadline) {
  const int P = size();
  const int r = rank();
  const size_t es = c10::elementSize(type);
  const size_t bytes = count * es;
  // Where our tensor lies: (lend number + 1) << 40 | offset in our region, or 0.
  constexpr int kShift = 40;
  uint64_t at = 0;
  std::shared_ptr<SharedMapping> mapping;  // held while peers may read through it
  size_t regionBytes = 0;
  for (size_t k = 0; k < lent_.size() && at == 0; ++k) {
    auto m = lent_[k].mapping.lock();
    if (!m) continue;
    const size_t region = lent_[k].regionBytes;
    char* mine = m->data() + static_cast<size_t>(r) * region;
    if (data >= mine && data + bytes <= mine + region) {
      at = (static_cast<uint64_t>(k) + 1) << kShift | static_cast<uint64_t>(data - mine);
      mapping = std::move(m);
      regionBytes = region;
    }
  }
  RankControl* control = segment_.control();
  control[r].lentAt.store(at, std::memory_order_relaxed);
  control[r].lentBytes.store(bytes, std::memory_order_relaxed);
  phase(deadline);  // our input is ready (when lent), and we said where it is
  for (int j = 0; j < P; ++j) {
    if (control[j].lentAt.load(std::memory_order_relaxed) != at ||
        control[j].lentBytes.load(std::memory_order_relaxed) != bytes) {
      at = 0;
    }
  }
  if (at == 0) return false;  // every rank saw the same descriptors: all fall back alike
  const size_t offset = at & ((uint64_t{1} << kShift) - 1);
  auto tensorOf = [&](int j) {
    return mapping->data() + static_cast<size_t>(j) * regionBytes + offset;
  };
  const size_t line = std::max<size_t>(1, 64 / es);
  const size_t slice = ((count + P - 1) / P + line - 1) / line * line;
  auto lo = [&](int j) { return std::min(count, slice * j); };
  auto hi = [&](int j) { return std::min(count, slice * (j + 1)); };
  // Our slice, read from every rank's tensor and written back into every one of them in the same
  // pass, a block at a time: no rank reads or writes another's slice, so nothing races.
  if (const size_t len = hi(r) - lo(r); len > 0) {
    InputList ins(P);
    OutputList outs(P);
    const void** inputs = ins.data();
    void** outputs = outs.data();
    for (int j = 0; j < P; ++j) inputs[j] = tensorOf(j) + lo(r) * es;  // ours (r): data
    // Ours first, stored through the cache; the peers' streamed (they read them next).
    outputs[0] = data + lo(r) * es;
    for (int j = 0, o = 1; j < P; ++j) {
      if (j != r) outputs[o++] = tensorOf(j) + lo(r) * es;
    }
    reduceManyTo(outputs, P, inputs, P, len, type, op == ReduceOp::Avg ? ReduceOp::Sum : op,
                 op == ReduceOp::Avg ? P : 1, stream ? 1 : -1);
  }
  phase(deadline);  // every slice is in every tensor, and nobody reads a peer's tensor any more
  return true;
}

void Collectives::broadcast(void* data, size_t bytes, int root, Clock::time_point deadline) {
  if (bytes == 0 || size() == 1) return;
  sync_.checkPeers();
  const size_t chunk = segment_.slotBytes();
  const bool stream = streams(bytes);
  auto* p = static_cast<char*>(data);
  for (size_t done = 0; done < bytes; done += chunk) {
    const size_t n = std::min(chunk, bytes - done);
    const int parity = nextParity();
    if (rank() == root) copyOut(segment_.slot(parity, root), p + done, n, stream);
    phase(deadline);
    if (rank() != root) std::memcpy(p + done, segment_.slot(parity, root), n);
  }
}

void Collectives::allgather(const void* in, size_t bytes, void* out, Clock::time_point deadline) {
  auto* o = static_cast<char*>(out);
  const auto* i = static_cast<const char*>(in);
  if (bytes == 0) return;
  std::memcpy(o + rank() * bytes, i, bytes);
  if (size() == 1) return;
  sync_.checkPeers();
  const size_t chunk = segment_.slotBytes();
  const bool stream = streams(bytes * size());
  for (size_t done = 0; done < bytes; done += chunk) {
    const size_t n = std::min(chunk, bytes - done);
    const int parity = nextParity();
    copyOut(segment_.slot(parity, rank()), i + done, n, stream);
    phase(deadline);
    for (int j = 0; j < size(); ++j) {
      if (j != rank()) std::memcpy(o + j * bytes + done, segment_.slot(parity, j), n);
    }
  }
}

void Collectives::barrier(Clock::time_point deadline) {
  if (size() == 1) return;
  sync_.checkPeers();
  phase(deadline);
}

}  // namespace ddprun::runtime::shm
