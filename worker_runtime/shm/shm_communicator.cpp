#include "worker_runtime/shm/shm_communicator.h"

#include <sched.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "base/errors.h"
#include "base/timeline.h"
#include "base/log.h"
#include "rendezvous/prefix_store.h"
#include "worker_runtime/queued_communicator.h"
#include "worker_runtime/shm/collectives.h"
#include "worker_runtime/work_queue.h"

namespace ddprun::runtime::shm {
namespace {

std::string hostIdentity() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string boot;
  std::getline(f, boot);
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return boot + "/" + host;
}

// The CPUs this process may run on (its affinity mask, which a container or taskset narrows).
int usableCpus() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::thread::hardware_concurrency());
}

int defaultSpin(int size) {
  const int cpus = usableCpus();
  return cpus <= 0 || size <= cpus ? 50 : 0;
}

class ShmCommunicator final : public QueuedCommunicator {
 public:
  ShmCommunicator(std::shared_ptr<rendezvous::Store> store, ShmOptions options)
      : options_(std::move(options)) {
    const int64_t n = store->add("shm/count/" + std::to_string(options_.rank), 1);
    store_ = std::make_shared<rendezvous::PrefixStore>("shm/" + std::to_string(n), std::move(store));
    segment_ = std::make_unique<Segment>(*store_, SegmentOptions{.rank = options_.rank,
                                                                .size = options_.size,
                                                                .slotBytes = options_.slotBytes,
                                                                .namePrefix = options_.namePrefix,
                                                                .timeout = options_.timeout});
    const int spin = options_.spinMicros >= 0 ? options_.spinMicros : defaultSpin(options_.size);
    collectives_ = std::make_unique<Collectives>(
        *segment_, CollectiveOptions{.directMaxBytes = options_.directMaxBytes,
                                     .streamStores = options_.streamStores,
                                     .streamMinBytes = options_.streamMinBytes,
                                     .sync = {.spinMicros = spin,
                                              .yieldMicros = options_.yieldMicros >= 0
                                                                 ? options_.yieldMicros
                                                                 : 2000,
                                              .pollMillis = options_.pollMillis}});
  }

  ~ShmCommunicator() override { queue_.drain(); }

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  std::string_view backend() const override { return "shm"; }
  torch::Device device() const override { return torch::kCPU; }
  Millis timeout() const override { return options_.timeout; }

  void abort() override { fail("aborted by this rank (in-process recovery)"); }
  AllreduceBytes allreduceBytes() const override {
    return {.staged = collectives_->stagedBytes(), .inPlace = collectives_->inPlaceBytes()};
  }

  // A new mapping per lend (its size is known only now), set up like the segment: all ranks get
  // it or none (mapping.h; should one rank alone fail, the allreduce finds out and copies).
  // Registered with the collectives between two collectives (runInline), so that the
  // communication thread never sees the list change under it.
  torch::Tensor lendSharedBuffer(size_t bytes) override {
    const size_t region = (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096;
    const int k = lends_++;
    ddprun::timeline::Scope span("lend buffer", "runtime");
    span.countMinorFaults();
    span.args().add("bytes", static_cast<int64_t>(bytes));
    rendezvous::PrefixStore scoped("lend/" + std::to_string(k), store_);
    std::shared_ptr<SharedMapping> mapping;
    try {
      if (options_.reuseLent && options_.lentCarry) mapping = reuseCarried(scoped, k, region);
      span.args().add("reused", static_cast<int64_t>(mapping ? 1 : 0));
      if (!mapping) {
        mapping = std::make_shared<SharedMapping>(
            scoped, MappingOptions{.rank = rank(), .size = size(),
                                   .bytes = region * static_cast<size_t>(size()),
                                   .namePrefix = options_.namePrefix,
                                   .timeout = options_.timeout,
                                   .what = "lent buffer",
                                   .keepFd = options_.lentCarry != nullptr});
      }
    } catch (const Error& e) {
      DDPRUN_LOG(WARN, "shm") << "no shared buffer of " << bytes << " bytes (collectives copy "
                              << "through the segment instead): " << e.what();
    }
    // Added even when empty: that lends exist must look alike on every rank (collectives.h).
    queue_.runInline([&] { collectives_->addLent(mapping, region); });
    if (!mapping) return {};
    char* mine = mapping->data() + static_cast<size_t>(rank()) * region;
    // Freed, the buffer goes into the carry for the next generation's k-th lend.
    return torch::from_blob(
        mine, {static_cast<int64_t>(region)},
        [mapping, carry = options_.lentCarry, k](void*) mutable {
          try {
            if (carry) carry->keep(k, std::move(mapping));
          } catch (...) {  // (no memory for the map's node: the buffer is unmapped instead)
          }
          mapping.reset();
        },
        torch::TensorOptions().dtype(torch::kUInt8));
  }

  torch::Tensor allgather(const torch::Tensor& input) override {
    checkCollectiveTensor(input, *this, "allgather");
    torch::Tensor out = allgatherOutput(input, size());
    queue_.runInline([&] {
      guarded("allgather", input.nbytes(), [&](Clock::time_point deadline) {
        collectives_->allgather(input.data_ptr(), input.nbytes(), out.data_ptr(), deadline);
      });
    });
    return out;
  }

  void barrier() override {
    queue_.runInline([&] {
      guarded("barrier", 0, [&](Clock::time_point deadline) { collectives_->barrier(deadline); });
    });
  }

 protected:
  WorkQueue& queue() override { return queue_; }
  const WorkQueue& queue() const override { return queue_; }

  void allreduceNow(const torch::Tensor& t, ReduceOp op) override {
    guarded("allreduce", t.nbytes(), [&](Clock::time_point deadline) {
      collectives_->allreduce(t.data_ptr(), static_cast<size_t>(t.numel()), t.scalar_type(), op,
                              deadline);
    });
  }

  void broadcastNow(const torch::Tensor& t, int root) override {
    guarded("broadcast", t.nbytes(), [&](Clock::time_point deadline) {
      collectives_->broadcast(t.data_ptr(), t.nbytes(), root, deadline);
    });
  }

 private:

  // The k-th lend's buffer carried from an earlier generation (lent_carry.h has the protocol),
  // or null when the ranks carry none they can all map: then every rank maps a new one. Throws
  // TimeoutError (a rank never answered) or BackendError (the segment failed).
  //
  // Round 1 goes through the store (a replacement opens the buffer by what it reads there);
  // rounds 2 and 3, a status from each rank, through the segment (statusRound): an allgather among
  // the ranks themselves, not three round trips to the store each.
  //
  // The store is not trusted with the memory (docs/security.md): every rank goes through the
  // same rounds whatever it read, so that ranks shown different offers still meet; a rank uses what
  // it carries by its own record, never by its offer as the store returns it (a replaced one is
  // a failure); a replacement opens only the pid the source rank wrote into this generation's
  // segment; and before any rank uses the buffer, every rank checks that it is the same memory
  // on all: each writes a random value at the start of its region and into its control in the
  // segment, and reads everyone's back through its own mapping. Another memory anywhere
  // (whoever's doing) fails the check on every rank, and every rank maps a new buffer.
  std::shared_ptr<SharedMapping> reuseCarried(rendezvous::Store& scoped, int k, size_t region) {
    Opened opened = openCarried(scoped, k, region * static_cast<size_t>(size()));
    // Never 0: a rank that mapped nothing, or gave up, leaves 0 in its control.
    uint64_t check = 0;
    if (opened.mapping) {
      check = (uint64_t{std::random_device{}()} << 32) | std::random_device{}() | 1;
      checkWord(*opened.mapping, rank(), region)->store(check, std::memory_order_release);
    }
    RankControl& mine = segment_->control()[rank()];
    mine.lentCheck.store(check, std::memory_order_release);
    if (everyoneOpened(opened) && everyoneSees(opened.mapping.get(), region)) {
      return opened.mapping;
    }
    mine.lentCheck.store(0, std::memory_order_release);
    return nullptr;
  }

  // What round 1 left this rank: the buffer it maps (null: none), or why it could not.
  struct Opened {
    std::shared_ptr<SharedMapping> mapping;
    std::string failure;
  };

  // Round 1 (offer/): each rank offers the buffer it carries (its file, size, pid and fd) and
  // reads every offer; all choose the same source (lent_carry.h, chooseCarried). A survivor maps
  // its own carried buffer by its own record; a rank that carries none (the replacement) opens
  // the source's fd through /proc, but only for the pid the source wrote into this generation's
  // segment. What the store said wrong (a malformed offer, this rank's own offer replaced,
  // another pid) is the failure returned, never thrown: the ranks must all reach round 2.
  Opened openCarried(rendezvous::Store& scoped, int k, size_t bytes) {
    std::shared_ptr<SharedMapping> kept = options_.lentCarry->take(k);
    std::optional<LentOffer> mine;
    if (kept && kept->fd() >= 0) {
      mine = LentOffer{.file = kept->identity(), .bytes = kept->bytes(),
                       .pid = ::getpid(), .fd = kept->fd()};
    }
    const std::string myOffer = formatOffer(mine);
    scoped.set("offer/" + std::to_string(rank()), myOffer);
    const std::vector<std::string> texts = everyone(scoped, "offer/");
    std::optional<int> source;
    std::vector<std::optional<LentOffer>> offers;
    try {
      for (const auto& text : texts) offers.push_back(parseOffer(text));
      source = chooseCarried(offers, bytes);
    } catch (const BackendError& e) {
      return {.failure = e.what()};
    }
    if (texts[rank()] != myOffer) {
      return {.failure = "its offer in the store was replaced by '" + texts[rank()] +
                         "' (it wrote '" + myOffer + "')"};
    }
    if (!source) return {};  // nothing all can reuse
    if (mine) return {.mapping = kept};
    const LentOffer& from = *offers[*source];
    const int32_t pid = segment_->control()[*source].pid.load(std::memory_order_relaxed);
    if (from.pid != pid) {
      return {.failure = "local rank " + std::to_string(*source) + "'s offer names pid " +
                         std::to_string(from.pid) + ", not the rank's pid " + std::to_string(pid)};
    }
    try {
      const std::string path =
          "/proc/" + std::to_string(from.pid) + "/fd/" + std::to_string(from.fd);
      return {.mapping = std::make_shared<SharedMapping>(
                  path, from.bytes, from.file,
                  "lent buffer of local rank " + std::to_string(*source), /*keepFd=*/true)};
    } catch (const BackendError& e) {
      return {.failure = e.what()};
    }
  }

  // Round 2: "1" mapped, "-" nothing to reuse, "!why" failed. True when every rank mapped the
  // buffer; rank 0 logs another rank's failure.
  bool everyoneOpened(const Opened& opened) {
    const auto answers =
        statusRound(!opened.failure.empty() ? "!" + opened.failure : opened.mapping ? "1" : "-");
    for (int r = 0; r < size(); ++r) {
      if (answers[r] == "1") continue;
      if (rank() == 0 && !answers[r].empty() && answers[r][0] == '!') {
        DDPRUN_LOG(WARN, "shm") << "local rank " << r << " could not map the lent buffer the "
                                << "survivors carry (a new one is mapped): " << answers[r].substr(1);
      }
      return false;
    }
    return true;
  }

  // Round 3: through its own mapping, this rank reads the check value every rank wrote at the
  // start of its region, against the one in that rank's control. A round of its own, after
  // round 2, because a rank that returns writes into its region at once. True when every rank
  // saw every value; rank 0 logs what one did not.
  bool everyoneSees(const SharedMapping* mapping, size_t region) {
    // (Only a forged "opened" lets a rank without a mapping get here: its peers find its 0.)
    std::string mismatch =
        mapping ? std::string() : "local rank " + std::to_string(rank()) + " mapped nothing";
    const RankControl* control = segment_->control();
    for (int r = 0; r < size() && mapping && mismatch.empty(); ++r) {
      const uint64_t want = control[r].lentCheck.load(std::memory_order_acquire);
      const uint64_t seen = checkWord(*mapping, r, region)->load(std::memory_order_acquire);
      if (want == 0 || seen != want) {
        mismatch = "local rank " + std::to_string(r) + "'s region holds " +
                   std::to_string(seen) + " in local rank " + std::to_string(rank()) +
                   "'s mapping, it wrote " + std::to_string(want);
      }
    }
    const auto answers = statusRound(mismatch.empty() ? "1" : "!" + mismatch);
    for (int r = 0; r < size(); ++r) {
      if (answers[r] == "1") continue;
      if (rank() == 0) {
        DDPRUN_LOG(WARN, "shm") << "the lent buffer the survivors carry is not the same memory "
                                << "on every local rank (" << answers[r].substr(1) << "): a new "
                                << "one is mapped; was an offer in the store forged?";
      }
      return false;
    }
    return true;
  }

  // A round among the ranks through the segment: every rank's `status`, cut at
  // kStatusBytes - 1 (a failure's text; it is only logged). Throws as a collective does.
  static constexpr size_t kStatusBytes = 256;
  std::vector<std::string> statusRound(const std::string& status) {
    std::vector<char> mine(kStatusBytes, '\0');
    std::vector<char> all(kStatusBytes * static_cast<size_t>(size()));
    std::memcpy(mine.data(), status.data(), std::min(status.size(), kStatusBytes - 1));
    queue_.runInline([&] {
      guarded("lend round", kStatusBytes, [&](Clock::time_point deadline) {
        collectives_->allgather(mine.data(), kStatusBytes, all.data(), deadline);
      });
    });
    std::vector<std::string> statuses;
    for (int r = 0; r < size(); ++r) {
      const char* text = all.data() + static_cast<size_t>(r) * kStatusBytes;
      statuses.emplace_back(text, ::strnlen(text, kStatusBytes));
    }
    return statuses;
  }

  // Every rank's value of `what`<rank>, once all are there (bounded by the timeout).
  std::vector<std::string> everyone(rendezvous::Store& scoped, const std::string& what) {
    std::vector<std::string> keys;
    for (int r = 0; r < size(); ++r) keys.push_back(what + std::to_string(r));
    scoped.wait(keys, options_.timeout);
    return scoped.multiGet(keys);
  }

  // The check word at the start of rank r's region of a lent buffer.
  static std::atomic<uint64_t>* checkWord(const SharedMapping& mapping, int r, size_t region) {
    return reinterpret_cast<std::atomic<uint64_t>*>(mapping.data() + static_cast<size_t>(r) * region);
  }

  // Runs one collective: refuses at once when an earlier one failed; on failure marks this rank
  // aborted in the segment (peers fail at once) and names the collective, its size and the rank.
  template <typename Fn>
  void guarded(const char* what, size_t bytes, Fn&& fn) {
    broken_.throwIfBroken(backend(), what);
    // Built only on failure: a small collective must not pay for formatting.
    auto where = [&] {
      return std::string("shm ") + what + " of " + std::to_string(bytes) + " bytes on rank " +
             std::to_string(rank()) + "/" + std::to_string(size());
    };
    try {
      fn(Clock::now() + options_.timeout);
    } catch (const TimeoutError& e) {
      fail(e.what());
      throw TimeoutError(where() + " timed out after " + std::to_string(timeout().count()) +
                         " ms: " + e.what());
    } catch (const BackendError& e) {
      fail(e.what());
      throw BackendError(where() + " failed: " + e.what());
    } catch (...) {
      fail("unexpected error");
      throw;
    }
  }

  void fail(const std::string& why) {
    collectives_->abort();
    broken_.set(why);
  }

  ShmOptions options_;
  std::shared_ptr<rendezvous::Store> store_;  // this communicator's keys (the lends' too)
  int lends_ = 0;
  std::unique_ptr<Segment> segment_;
  std::unique_ptr<Collectives> collectives_;
  BrokenLatch broken_;
  WorkQueue queue_;  // last member: its thread stops before the rest is destroyed
};

}  // namespace

std::shared_ptr<Communicator> makeShmCommunicator(std::shared_ptr<rendezvous::Store> store,
                                                  ShmOptions options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    throw ConfigError("shm: rank " + std::to_string(options.rank) + " is outside 0.." +
                      std::to_string(options.size - 1));
  }
  if (options.slotBytes < 4096) {
    throw ConfigError("shm: slot size " + std::to_string(options.slotBytes) +
                      " bytes is too small (at least 4096)");
  }
  return std::make_shared<ShmCommunicator>(std::move(store), std::move(options));
}

bool nodesOnOneHost(rendezvous::Store& store, const NodeMember& me) {
  store.set("shm/host/" + std::to_string(me.rank),
            std::to_string(me.node) + " " + std::to_string(me.localRank) + " " +
                std::to_string(me.localSize) + " " + hostIdentity());
  std::vector<std::string> keys;
  for (int r = 0; r < me.size; ++r) keys.push_back("shm/host/" + std::to_string(r));
  struct Node {
    std::string host;
    int localSize = 0;
    std::vector<bool> seen;
  };
  std::map<int, Node> nodes;
  for (const auto& v : store.multiGet(keys)) {
    std::istringstream in(v);
    int node = -1, localRank = -1, localSize = 0;
    std::string host;
    in >> node >> localRank >> localSize;
    std::getline(in >> std::ws, host);
    if (!in && !in.eof()) return false;
    if (localSize < 1 || localRank < 0 || localRank >= localSize) return false;
    Node& n = nodes[node];
    if (n.localSize == 0) n = {host, localSize, std::vector<bool>(localSize)};
    if (n.host != host || n.localSize != localSize || n.seen[localRank]) return false;
    n.seen[localRank] = true;
  }
  int expected = 0;
  for (const auto& [id, n] : nodes) {
    if (id != expected++) return false;  // nodes 0..N-1
    for (bool s : n.seen) {
      if (!s) return false;
    }
  }
  return true;
}

bool nodesOnOneHostOnce(rendezvous::Store& store, rendezvous::Store& attemptStore,
                        const NodeMember& me, bool laterGeneration, std::optional<bool>& known) {
  static const std::string kAnswer = "shm/host/answer";
  if (known) return *known;
  if (laterGeneration && attemptStore.check({kAnswer})) {
    known = attemptStore.get(kAnswer) == "1";
    return *known;
  }
  const bool answer = nodesOnOneHost(store, me);
  attemptStore.set(kAnswer, answer ? "1" : "0");
  known = answer;
  return answer;
}

}  // namespace ddprun::runtime::shm
