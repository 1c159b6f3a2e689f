#include "worker_runtime/mesh_allreduce.h"

#include <algorithm>

#include "base/errors.h"
#include "worker_runtime/reduce.h"

namespace ddprun::runtime {

std::string describeHeader(int rank, const CollectiveHeader& h) {
  static const char* kOps[] = {"sum", "avg", "min", "max"};
  static const char* kAlgorithms[] = {"?", "direct", "ring", "halving-doubling"};
  std::string dtype = "dtype " + std::to_string(h.dtype);
  if (h.dtype < static_cast<uint8_t>(c10::ScalarType::NumOptions)) {
    dtype = c10::toString(static_cast<c10::ScalarType>(h.dtype));
  }
  return "rank " + std::to_string(rank) + ": allreduce #" + std::to_string(h.seq) + " of " +
         std::to_string(h.count) + " elements of " + dtype + " (" +
         (h.op < 4 ? kOps[h.op] : "op ?") + ", " + (h.algorithm < 4 ? kAlgorithms[h.algorithm] : "?") +
         ")";
}

void MeshAllreduce::announce(const ReduceBuffer& buf, ReduceOp op, uint8_t algorithm) {
  const int P = mesh_->size();
  const int r = mesh_->rank();
  mine_ = CollectiveHeader{.seq = seq_++,
                           .dtype = static_cast<uint8_t>(buf.type),
                           .op = static_cast<uint8_t>(op),
                           .algorithm = algorithm,
                           .count = buf.count};
  theirs_.resize(P);
  for (int i = 1; i < P; ++i) {
    const int q = (r + i) % P;
    mesh_->postSend(q, &mine_, sizeof mine_);
    mesh_->postRecv(q, &theirs_[q], sizeof theirs_[q], [this, q, r] {
      if (theirs_[q] == mine_) return;
      throw BackendError("allreduce mismatch between ranks: " + describeHeader(r, mine_) +
                         "; " + describeHeader(q, theirs_[q]) +
                         " (every rank must reduce the same number of elements of the same dtype)");
    });
  }
}

void MeshAllreduce::direct(const ReduceBuffer& buf, ReduceOp op,
                           TcpMesh::Clock::time_point deadline) {
  const int P = mesh_->size();
  const int r = mesh_->rank();
  const size_t bytes = buf.count * c10::elementSize(buf.type);
  if (scratch_.size() < bytes * (P - 1)) scratch_.resize(bytes * (P - 1));
  announce(buf, op, 1);
  auto scratchOf = [&](int q) { return scratch_.data() + bytes * ((q - r - 1 + P) % P); };
  // Peers in the order r+1, r+2, ... so that not every rank talks to rank 0 first.
  for (int i = 1; i < P; ++i) mesh_->postRecv((r + i) % P, scratchOf((r + i) % P), bytes);
  for (int i = 1; i < P; ++i) mesh_->postSend((r + i) % P, buf.ptr, bytes);
  mesh_->progress(deadline);  // all sends done too: buf may be overwritten now
  if (bytes == 0) return;      // only the headers travelled (an empty tensor's data may be null)
  std::vector<const void*> inputs(P);
  for (int q = 0; q < P; ++q) inputs[q] = q == r ? buf.ptr : scratchOf(q);
  reduceMany(buf.ptr, inputs.data(), P, buf.count, buf.type, op);
}

// The ring as one stream of 2(P-1) steps. At step s a rank receives chunk (r-s-1) mod P from its
// left neighbour; during reduce-scatter (s <= P-2) into scratch, then reduces it into its own
// buffer; during allgather straight into its buffer. Every received segment except those of the
// last step is then forwarded to the right neighbour as step s+1. Step 0 sends chunk r.
// Receives into the buffer need no wait for earlier sends of the same region: the fully reduced
// chunk can only arrive after this rank's contribution to it went all the way round.
void MeshAllreduce::ring(const ReduceBuffer& buf, ReduceOp op, TcpMesh::Clock::time_point deadline,
                         const RingTuning& tuning) {
  const int P = mesh_->size();
  const int r = mesh_->rank();
  const size_t es = c10::elementSize(buf.type);
  const size_t segElems = std::max<size_t>(1, tuning.segmentBytes / es);
  const int right = (r + 1) % P;
  const int left = (r + P - 1) % P;
  const int steps = 2 * (P - 1);
  announce(buf, op, 2);
  auto mod = [P](long v) { return static_cast<int>(((v % P) + P) % P); };
  auto chunkBegin = [&](int c) { return buf.count * c / P; };
  auto chunkLen = [&](int c) { return chunkBegin(c + 1) - chunkBegin(c); };
  auto segments = [&](int c) { return (chunkLen(c) + segElems - 1) / segElems; };
  auto segPtr = [&](int c, size_t k) {
    return static_cast<char*>(buf.ptr) + (chunkBegin(c) + k * segElems) * es;
  };
  auto segLen = [&](int c, size_t k) { return std::min(segElems, chunkLen(c) - k * segElems); };

  struct Msg {
    int step;
    int chunk;
    size_t seg;
  };
  std::vector<Msg> inbound;  // what this rank receives, in order
  for (int s = 0; s < steps; ++s) {
    const int c = mod(r - s - 1);
    for (size_t k = 0; k < segments(c); ++k) inbound.push_back({s, c, k});
  }
  const size_t window = static_cast<size_t>(std::max(1, tuning.window));
  const size_t segBytes = segElems * es;
  if (scratch_.size() < segBytes * window) scratch_.resize(segBytes * window);

  size_t posted = 0;
  std::function<void()> postMore;
  auto onReceived = [&](size_t i) {
    const Msg& m = inbound[i];
    if (m.step <= P - 2) {
      reduceInto(segPtr(m.chunk, m.seg), scratch_.data() + (i % window) * segBytes,
                 segLen(m.chunk, m.seg), buf.type, op);
    }
    if (m.step + 1 < steps) mesh_->postSend(right, segPtr(m.chunk, m.seg), segLen(m.chunk, m.seg) * es);
    postMore();
  };
  size_t consumed = 0;
  postMore = [&] {
    while (posted < inbound.size() && posted - consumed < window) {
      const Msg& m = inbound[posted];
      char* dst = m.step <= P - 2 ? scratch_.data() + (posted % window) * segBytes
                                  : segPtr(m.chunk, m.seg);
      const size_t i = posted++;
      mesh_->postRecv(left, dst, segLen(m.chunk, m.seg) * es, [&, i] {
        ++consumed;
        onReceived(i);
      });
    }
  };
  postMore();
  for (size_t k = 0; k < segments(r); ++k) mesh_->postSend(right, segPtr(r, k), segLen(r, k) * es);
  mesh_->progress(deadline);
}

// Recursive halving then doubling. At halving step j (d = 2^j) ranks r and r^d hold the same
// region; the one with bit j clear keeps its lower half and sends the upper, the other the
// reverse; the kept half is received in segments and reduced as they arrive. After log2 P steps
// each rank owns 1/P of the buffer, fully reduced; doubling sends it back the same way.
void MeshAllreduce::halvingDoubling(const ReduceBuffer& buf, ReduceOp op,
                                    TcpMesh::Clock::time_point deadline, const RingTuning& tuning) {
  const int P = mesh_->size();
  const int r = mesh_->rank();
  DDPRUN_CHECK((P & (P - 1)) == 0, "halving-doubling needs a power-of-two size, not " << P);
  announce(buf, op, 3);
  const size_t es = c10::elementSize(buf.type);
  const size_t segElems = std::max<size_t>(1, tuning.segmentBytes / es);
  const size_t window = static_cast<size_t>(std::max(1, tuning.window));
  if (scratch_.size() < segElems * es * window) scratch_.resize(segElems * es * window);
  char* base = static_cast<char*>(buf.ptr);
  struct Step {
    int partner;
    size_t keepLo, keepHi, sendLo, sendHi;  // elements
  };
  std::vector<Step> steps;
  size_t lo = 0, hi = buf.count;
  for (int d = 1; d < P; d <<= 1) {
    const size_t mid = lo + (hi - lo) / 2;
    const bool lower = (r & d) == 0;
    steps.push_back({r ^ d, lower ? lo : mid, lower ? mid : hi, lower ? mid : lo, lower ? hi : mid});
    std::tie(lo, hi) = std::pair(steps.back().keepLo, steps.back().keepHi);
  }
  for (const Step& st : steps) {
    const size_t n = st.keepHi - st.keepLo;
    const size_t segs = (n + segElems - 1) / segElems;
    size_t posted = 0, consumed = 0;
    std::function<void()> postMore = [&] {
      while (posted < segs && posted - consumed < window) {
        const size_t k = posted++;
        const size_t off = st.keepLo + k * segElems;
        const size_t len = std::min(segElems, st.keepHi - off);
        char* slot = scratch_.data() + (k % window) * segElems * es;
        mesh_->postRecv(st.partner, slot, len * es, [&, off, len, slot] {
          ++consumed;
          reduceInto(base + off * es, slot, len, buf.type, op);
          postMore();
        });
      }
    };
    postMore();
    mesh_->postSend(st.partner, base + st.sendLo * es, (st.sendHi - st.sendLo) * es);
    mesh_->progress(deadline);
  }
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    mesh_->postRecv(it->partner, base + it->sendLo * es, (it->sendHi - it->sendLo) * es);
    mesh_->postSend(it->partner, base + it->keepLo * es, (it->keepHi - it->keepLo) * es);
    mesh_->progress(deadline);
  }
}

}  // namespace ddprun::runtime
