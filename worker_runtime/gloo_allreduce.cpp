#include "worker_runtime/gloo_allreduce.h"

#include <algorithm>
#include <deque>

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include "rendezvous/errors.h"
#include "worker_runtime/reduce.h"

namespace ddprun::runtime {
namespace {

using Clock = std::chrono::steady_clock;
using UB = std::unique_ptr<gloo::transport::UnboundBuffer>;

// Our slots live in their own range: Gloo's newer collectives build theirs from a small prefix
// in the top byte, its classic algorithms count up from 0.
constexpr uint64_t kSlotPrefix = uint64_t{0xDD} << 56;

std::chrono::milliseconds remaining(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  // Gloo reads a negative timeout as "use the context default": never pass one.
  return std::max(left, std::chrono::milliseconds(1));
}

void waitRecv(const UB& b, Clock::time_point deadline) {
  if (!b->waitRecv(remaining(deadline))) throw BackendError("gloo receive aborted");
}
void waitSend(const UB& b, Clock::time_point deadline) {
  if (!b->waitSend(remaining(deadline))) throw BackendError("gloo send aborted");
}

}  // namespace

GlooAllreduce::GlooAllreduce(std::shared_ptr<gloo::Context> context)
    : context_(std::move(context)) {}

uint64_t GlooAllreduce::reserveSlots(uint64_t n) {
  const uint64_t first = nextSlot_;
  nextSlot_ += n;
  return kSlotPrefix | (first & ((uint64_t{1} << 56) - 1));
}

void GlooAllreduce::direct(const ReduceBuffer& buf, ReduceOp op, Clock::time_point deadline) {
  const int P = context_->size;
  const int r = context_->rank;
  const size_t bytes = buf.count * c10::elementSize(buf.type);
  if (scratch_.size() < bytes * (P - 1)) scratch_.resize(bytes * (P - 1));
  const uint64_t slot = reserveSlots(1);
  // Peers in the order r+1, r+2, ... so that not every rank talks to rank 0 first.
  auto peer = [&](int i) { return (r + 1 + i) % P; };
  auto scratchOf = [&](int q) { return scratch_.data() + bytes * ((q - r - 1 + P) % P); };
  std::vector<UB> recvs, sends;
  for (int i = 0; i < P - 1; ++i) {
    recvs.push_back(context_->createUnboundBuffer(scratchOf(peer(i)), bytes));
    recvs.back()->recv(peer(i), slot);
  }
  for (int i = 0; i < P - 1; ++i) {
    sends.push_back(context_->createUnboundBuffer(buf.ptr, bytes));
    sends.back()->send(peer(i), slot);
  }
  for (auto& b : recvs) waitRecv(b, deadline);
  for (auto& b : sends) waitSend(b, deadline);  // before buf is overwritten below
  std::vector<const void*> inputs(P);
  for (int q = 0; q < P; ++q) inputs[q] = q == r ? buf.ptr : scratchOf(q);
  reduceMany(buf.ptr, inputs.data(), P, buf.count, buf.type, op);
}

// The ring as one stream of 2(P-1) steps. At step s a rank receives chunk (r-s-1) mod P from its
// left neighbour; during reduce-scatter (s <= P-2) it reduces it into its own buffer, during
// allgather it receives it straight into its buffer. Every received segment except those of the
// last step is then forwarded to the right neighbour as step s+1. Step 0 sends chunk r.
// Receives into the buffer need no wait for earlier sends of the same region: the fully reduced
// chunk can only arrive after this rank's contribution to it was received downstream.
void GlooAllreduce::ring(const ReduceBuffer& buf, ReduceOp op, Clock::time_point deadline,
                         const RingTuning& tuning) {
  const int P = context_->size;
  const int r = context_->rank;
  const size_t es = c10::elementSize(buf.type);
  const size_t segElems = std::max<size_t>(1, tuning.segmentBytes / es);
  const int right = (r + 1) % P;
  const int left = (r + P - 1) % P;
  const int steps = 2 * (P - 1);
  auto mod = [P](long v) { return static_cast<int>(((v % P) + P) % P); };
  auto chunkBegin = [&](int c) { return buf.count * c / P; };
  auto chunkLen = [&](int c) { return chunkBegin(c + 1) - chunkBegin(c); };
  auto segments = [&](int c) { return (chunkLen(c) + segElems - 1) / segElems; };
  auto segPtr = [&](int c, size_t k) {
    return static_cast<char*>(buf.ptr) + (chunkBegin(c) + k * segElems) * es;
  };
  auto segLen = [&](int c, size_t k) { return std::min(segElems, chunkLen(c) - k * segElems); };

  // Message (s, k) -- segment k of the chunk sent at step s -- has slot base + s * maxSegs + k.
  // The same on both ends, because the chunk a rank sends at step s is the one its right neighbour
  // receives at step s; and the number of slots reserved is the same on every rank.
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
  const size_t maxSegs = (chunkLen(P - 1) + segElems - 1) / segElems;  // the last chunk is largest
  const uint64_t base = reserveSlots(steps * maxSegs);
  auto slotOf = [&](int step, size_t k) { return base + step * maxSegs + k; };

  const int window = std::max(1, tuning.window);
  const size_t segBytes = segElems * es;
  if (scratch_.size() < segBytes * window) scratch_.resize(segBytes * window);

  std::vector<UB> sends;
  auto send = [&](int step, int c, size_t k) {
    sends.push_back(context_->createUnboundBuffer(segPtr(c, k), segLen(c, k) * es));
    sends.back()->send(right, slotOf(step, k));
  };
  std::deque<UB> recvs;
  size_t posted = 0;
  auto postRecvs = [&](size_t consumed) {
    while (posted < inbound.size() && posted - consumed < static_cast<size_t>(window)) {
      const Msg& m = inbound[posted];
      const size_t len = segLen(m.chunk, m.seg) * es;
      char* dst = m.step <= P - 2 ? scratch_.data() + (posted % window) * segBytes
                                  : segPtr(m.chunk, m.seg);
      recvs.push_back(context_->createUnboundBuffer(dst, len));
      recvs.back()->recv(left, slotOf(m.step, m.seg));
      ++posted;
    }
  };

  postRecvs(0);
  for (size_t k = 0; k < segments(r); ++k) send(0, r, k);
  for (size_t i = 0; i < inbound.size(); ++i) {
    waitRecv(recvs.front(), deadline);
    UB done = std::move(recvs.front());
    recvs.pop_front();
    const Msg& m = inbound[i];
    if (m.step <= P - 2) {
      reduceInto(segPtr(m.chunk, m.seg), done->ptr, segLen(m.chunk, m.seg), buf.type, op);
    }
    done.reset();
    postRecvs(i + 1);
    if (m.step + 1 < steps) send(m.step + 1, m.chunk, m.seg);
  }
  for (auto& b : sends) waitSend(b, deadline);
}

}  // namespace ddprun::runtime
