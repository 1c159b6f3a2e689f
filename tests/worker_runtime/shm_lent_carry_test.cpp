// Lent buffers carried from one generation to the next (worker_runtime/shm/lent_carry.h): the
// offers' text, the choice every rank makes from them, and ranks as threads of this process
// that lend, drop their communicators as a recovery does, and lend again in a "next
// generation" where one rank comes with nothing (the replacement). The multi-process case (real
// survivors and a spare under ddprun, through /proc/<pid>/fd) is the hot-spare e2e tests'.
#include "tests/support/catch_torch.h"

#include <fcntl.h>
#include <unistd.h>

#include <sys/mman.h>
#include <sys/stat.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "base/errors.h"
#include "rendezvous/memory_store.h"
#include "tests/support/forwarding_store.h"
#include "tests/support/temp_dir.h"
#include "tests/worker_runtime/rank_threads.h"
#include "worker_runtime/shm/lent_carry.h"
#include "worker_runtime/shm/shm_communicator.h"
#include "tests/worker_runtime/shm_names.h"

using namespace ddprun::runtime;
using ddprun::rendezvous::MemoryStore;
using test::runRanks;
using test::shmLeftovers;
using test::uniqueShmPrefix;

namespace {

// One generation: P ranks as threads on a store of their own, rank r with carries[r] (null: a
// process that carries nothing, none kept either).
// `view(r, store)`, when given, is the store rank r uses (what it reads of the shared one).
using StoreView = std::function<std::shared_ptr<ddprun::rendezvous::Store>(
    int, std::shared_ptr<ddprun::rendezvous::Store>)>;
std::vector<std::shared_ptr<Communicator>> generation(
    int P, const std::vector<std::shared_ptr<shm::LentCarry>>& carries, bool reuse,
    const std::string& prefix, StoreView view = {}) {
  auto store = std::make_shared<MemoryStore>(std::chrono::seconds(20));
  std::vector<std::shared_ptr<Communicator>> comms(P);
  runRanks(P, [&](int r) {
    comms[r] = shm::makeShmCommunicator(view ? view(r, store) : store, {.rank = r,
                                                .size = P,
                                                .timeout = std::chrono::seconds(20),
                                                .slotBytes = 4096,
                                                .namePrefix = prefix,
                                                .lentCarry = carries[r],
                                                .reuseLent = reuse});
  });
  return comms;
}

std::vector<torch::Tensor> lend(std::vector<std::shared_ptr<Communicator>>& comms, size_t bytes) {
  std::vector<torch::Tensor> lent(comms.size());
  runRanks(static_cast<int>(comms.size()),
           [&](int r) { lent[r] = comms[r]->lendSharedBuffer(bytes); });
  for (const auto& t : lent) REQUIRE(t.defined());
  return lent;
}

// Allreduce (sum) of rank r's 1s * (r + 1) in each rank's lent memory: every rank must hold the
// sum, and reduced in place (which needs every rank's tensor at the same place in one memory).
void checkInPlaceSum(std::vector<std::shared_ptr<Communicator>>& comms,
                     std::vector<torch::Tensor>& lent) {
  const int P = static_cast<int>(comms.size());
  const int64_t n = 65537;
  std::vector<torch::Tensor> out(P);
  std::vector<AllreduceBytes> before(P), after(P);
  runRanks(P, [&](int r) {
    out[r] = lent[r].narrow(0, 4096, n * 4).view(torch::kFloat32);
    out[r].fill_(static_cast<float>(r + 1));
    before[r] = comms[r]->allreduceBytes();
    comms[r]->allreduceAsync(out[r], ReduceOp::Sum)->wait();
    after[r] = comms[r]->allreduceBytes();
  });
  const float sum = static_cast<float>(P * (P + 1) / 2);
  for (int r = 0; r < P; ++r) {
    CHECK(torch::equal(out[r], torch::full({n}, sum)));
    CHECK(after[r].inPlace - before[r].inPlace == uint64_t(n * 4));
  }
}

// A byte of each region past the check word a carried lend writes at its start.
constexpr int64_t kMarkerAt = 64;
uint8_t marker(const torch::Tensor& lent) { return lent.data_ptr<uint8_t>()[kMarkerAt]; }
void setMarker(torch::Tensor& lent, uint8_t value) { lent.narrow(0, kMarkerAt, 1).fill_(value); }

}  // namespace

TEST_CASE("lent carry: an offer round-trips, a malformed one is refused naming it, and every "
          "rank's choice depends on the offers alone", "[shm]") {
  const shm::LentOffer a{.file = {.device = 7, .inode = 42}, .bytes = 8192, .pid = 1234, .fd = 9};
  const auto back = shm::parseOffer(shm::formatOffer(a));
  REQUIRE(back);
  CHECK(back->file == a.file);
  CHECK(back->bytes == 8192);
  CHECK(back->pid == 1234);
  CHECK(back->fd == 9);
  CHECK(shm::formatOffer(std::nullopt) == "-");
  CHECK_FALSE(shm::parseOffer("-"));
  for (const std::string bad : {"", "7 42 8192 1234", "7 42 8192 1234 9 extra", "7 42 0 1234 9",
                                "7 42 8192 -1 9", "x 42 8192 1234 9"}) {
    INFO(bad);
    try {
      shm::parseOffer(bad);
      FAIL("accepted");
    } catch (const ddprun::BackendError& e) {
      CHECK_THAT(e.what(), Catch::Matchers::Contains("'" + bad + "'"));
    }
  }
  shm::LentOffer other = a;
  other.file.inode = 43;
  shm::LentOffer bigger = a;
  bigger.bytes = 16384;
  using Offers = std::vector<std::optional<shm::LentOffer>>;
  CHECK_FALSE(shm::chooseCarried(Offers{std::nullopt, std::nullopt}, 8192));  // nobody carries
  CHECK(shm::chooseCarried(Offers{std::nullopt, a, a}, 8192) == 1);           // the lowest holder
  CHECK(shm::chooseCarried(Offers{a, a}, 8192) == 0);
  CHECK_FALSE(shm::chooseCarried(Offers{a, other, std::nullopt}, 8192));  // different memories
  CHECK_FALSE(shm::chooseCarried(Offers{a, std::nullopt}, 16384));        // another size asked
  CHECK(shm::chooseCarried(Offers{bigger, bigger}, 8192) == 0);  // larger: a shrunk group's
  CHECK_FALSE(shm::chooseCarried(Offers{a, bigger}, 8192));  // one memory, two sizes: forged
}

TEST_CASE("shm lent buffer carried into the next generation: the survivors keep their memory "
          "where it was, the replacement maps the same memory, and the allreduce is in place "
          "with every rank's sum", "[shm]") {
  const std::string prefix = uniqueShmPrefix("carry-test");
  const int P = 3;
  std::vector<std::shared_ptr<shm::LentCarry>> carries;
  for (int r = 0; r < P; ++r) carries.push_back(std::make_shared<shm::LentCarry>());
  auto comms = generation(P, carries, /*reuse=*/false, prefix);
  auto lent = lend(comms, 1 << 20);
  checkInPlaceSum(comms, lent);
  std::vector<void*> where(P);
  for (int r = 0; r < P; ++r) {
    where[r] = lent[r].data_ptr();
    setMarker(lent[r], static_cast<uint8_t>(10 + r));
  }
  // The recovery: the old communicators and their lent tensors go (DDP rebuilt), rank 2 died.
  comms.clear();
  lent.clear();
  carries[2] = std::make_shared<shm::LentCarry>();  // the replacement carries nothing
  comms = generation(P, carries, /*reuse=*/true, prefix);
  lent = lend(comms, 1 << 20);
  CHECK(shmLeftovers(prefix) == 0);
  CHECK(lent[0].data_ptr() == where[0]);  // the survivors' own mappings, not new ones
  CHECK(lent[1].data_ptr() == where[1]);
  // The replacement's region is what the dead rank left there: the same memory.
  for (int r = 0; r < P; ++r) CHECK(int(marker(lent[r])) == 10 + r);
  checkInPlaceSum(comms, lent);
  // A generation that asks for another size gets new memory (zero-filled), on every rank.
  comms.clear();
  lent.clear();
  comms = generation(P, carries, /*reuse=*/true, prefix);
  lent = lend(comms, 2 << 20);
  for (int r = 0; r < P; ++r) CHECK(int(marker(lent[r])) == 0);
  checkInPlaceSum(comms, lent);
  CHECK(shmLeftovers(prefix) == 0);
}

TEST_CASE("shm lent buffer carried through a shrink and a grow back: the shrunk group keeps "
          "the larger buffer, and the replacement that grows it back maps that memory", "[shm]") {
  const std::string prefix = uniqueShmPrefix("carry-test");
  const size_t region = 1 << 20;
  std::vector<std::shared_ptr<shm::LentCarry>> carries;
  for (int r = 0; r < 3; ++r) carries.push_back(std::make_shared<shm::LentCarry>());
  auto comms = generation(3, carries, /*reuse=*/false, prefix);
  auto lent = lend(comms, region);
  std::vector<char*> where(3);
  for (int r = 0; r < 3; ++r) {
    where[r] = static_cast<char*>(lent[r].data_ptr());
    setMarker(lent[r], static_cast<uint8_t>(10 + r));
  }
  // Rank 1 dies, the group shrinks: ranks 0 and 2 are ranks 0 and 1 of two, and each uses the
  // region of its new rank in the three-region buffer it carries.
  comms.clear();
  lent.clear();
  comms = generation(2, {carries[0], carries[2]}, /*reuse=*/true, prefix);
  lent = lend(comms, region);
  CHECK(shmLeftovers(prefix) == 0);
  CHECK(static_cast<char*>(lent[0].data_ptr()) == where[0]);
  CHECK(static_cast<char*>(lent[1].data_ptr()) == where[2] - region);  // its mapping, region 1
  CHECK(int(marker(lent[0])) == 10);
  CHECK(int(marker(lent[1])) == 11);  // what the dead rank left in region 1: the same memory
  checkInPlaceSum(comms, lent);
  // The group grows back: the replacement takes rank 1 and maps the buffer the survivors kept.
  comms.clear();
  lent.clear();
  comms = generation(3, {carries[0], std::make_shared<shm::LentCarry>(), carries[2]},
                     /*reuse=*/true, prefix);
  lent = lend(comms, region);
  CHECK(shmLeftovers(prefix) == 0);
  CHECK(static_cast<char*>(lent[0].data_ptr()) == where[0]);
  CHECK(static_cast<char*>(lent[2].data_ptr()) == where[2]);
  for (int r = 0; r < 3; ++r) CHECK(int(marker(lent[r])) == 10 + r);
  checkInPlaceSum(comms, lent);
}

TEST_CASE("shm lent buffer carried: a replacement that cannot map what the survivors carry "
          "makes every rank map a new one", "[shm]") {
  const std::string prefix = uniqueShmPrefix("carry-test");
  const int P = 2;
  std::vector<std::shared_ptr<shm::LentCarry>> carries{std::make_shared<shm::LentCarry>(),
                                                       std::make_shared<shm::LentCarry>()};
  auto comms = generation(P, carries, /*reuse=*/false, prefix);
  auto lent = lend(comms, 1 << 20);
  setMarker(lent[0], 77);
  comms.clear();
  lent.clear();
  // Rank 0's descriptor of the memory now names /dev/null: what the replacement opens through
  // /proc is another file (as when the pid or the descriptor number was reused).
  auto kept = carries[0]->take(0);
  REQUIRE(kept);
  const int fd = kept->fd();
  REQUIRE(fd >= 0);
  const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  REQUIRE(null >= 0);
  REQUIRE(::dup3(null, fd, O_CLOEXEC) == fd);
  ::close(null);
  carries[0]->keep(0, std::move(kept));
  carries[1] = std::make_shared<shm::LentCarry>();
  comms = generation(P, carries, /*reuse=*/true, prefix);
  lent = lend(comms, 1 << 20);
  for (int r = 0; r < P; ++r) CHECK(int(marker(lent[r])) == 0);  // new memory on both
  checkInPlaceSum(comms, lent);
  CHECK(shmLeftovers(prefix) == 0);
}

namespace {

// What an attacker in the store makes one rank read: every multiGet of a key that ends with
// `suffix` returns `forged` instead (the key was rewritten after the other ranks read it).
class ForgingView final : public ddprun::testing::ForwardingStore {
 public:
  ForgingView(std::shared_ptr<Store> inner, std::string suffix, std::string forged)
      : ForwardingStore(std::move(inner)), suffix_(std::move(suffix)), forged_(std::move(forged)) {}
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override {
    auto values = inner().multiGet(keys);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i].ends_with(suffix_)) {
        values[i] = forged_;
        ++forgedReads;
      }
    }
    return values;
  }
  int forgedReads = 0;

 private:
  std::string suffix_, forged_;
};

// Memory outside the job, offered as the attacker's: a memfd of `bytes` zeros, or with `path` a
// file of that name (as a checkpoint being written is: it has a name, unlike any lent buffer).
struct OutsideMemory {
  explicit OutsideMemory(size_t bytes, const std::string& path = "")
      : fd(path.empty() ? ::memfd_create("outside", MFD_CLOEXEC)
                        : ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600)),
        bytes(bytes) {
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, static_cast<off_t>(bytes)) == 0);
  }
  ~OutsideMemory() { ::close(fd); }
  std::string offer(int64_t pid) const {
    struct stat st {};
    REQUIRE(::fstat(fd, &st) == 0);
    return shm::formatOffer(shm::LentOffer{
        .file = {.device = static_cast<uint64_t>(st.st_dev), .inode = static_cast<uint64_t>(st.st_ino)},
        .bytes = bytes, .pid = pid, .fd = fd});
  }
  // Whether every byte is still 0 but the `n` from `at`: nothing else of the job was written.
  bool zeroBut(size_t at, size_t n) const {
    void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    REQUIRE(p != MAP_FAILED);
    const auto* b = static_cast<const uint8_t*>(p);
    bool zero = true;
    for (size_t i = 0; i < bytes && zero; ++i) zero = b[i] == 0 || (i >= at && i < at + n);
    ::munmap(p, bytes);
    return zero;
  }
  int fd;
  size_t bytes;
};

}  // namespace

TEST_CASE("shm lent buffer carried: forged offers (another memory of the right size, another "
          "pid, a rank's own offer replaced, a larger file with a name) make every rank map a new buffer, and the job's "
          "data never goes to the forged memory", "[shm][security]") {
  const std::string prefix = uniqueShmPrefix("carry-test");
  const int P = 2;
  const size_t region = 1 << 20;
  OutsideMemory outside(region * P);
  ddprun::testing::TempDir dir;
  OutsideMemory named(region * 4, dir / "checkpoint.pt");  // larger than asked
  struct Forgery {
    const char* what;
    std::string suffix, value;
    const OutsideMemory& memory;
    size_t written;  // what may reach it: the replacement's check word, or nothing
  };
  // Rank 0 carries the buffer, rank 1 is the replacement; what rank 1 reads is forged.
  const std::vector<Forgery> forgeries = {
      // The memfd's own pid and identity: it opens and passes every check the offer allows
      // (threads share the pid the segment records); only the check through the memory fails.
      {"rank 0's offer names outside memory", "lend/0/offer/0", outside.offer(::getpid()),
       outside, 8},
      {"rank 0's offer names another pid", "lend/0/offer/0", outside.offer(1), outside, 8},
      {"rank 1's own offer replaced", "lend/0/offer/1", outside.offer(::getpid()), outside, 8},
      // Larger than asked, as a shrunk group's buffer is, but a file with a name: never mapped.
      {"rank 0's offer names a file with a name", "lend/0/offer/0", named.offer(::getpid()),
       named, 0},
  };
  for (const auto& forgery : forgeries) {
    DYNAMIC_SECTION(forgery.what) {
      std::vector<std::shared_ptr<shm::LentCarry>> carries{std::make_shared<shm::LentCarry>(),
                                                           std::make_shared<shm::LentCarry>()};
      auto comms = generation(P, carries, /*reuse=*/false, prefix);
      auto lent = lend(comms, region);
      setMarker(lent[0], 77);
      comms.clear();
      lent.clear();
      carries[1] = std::make_shared<shm::LentCarry>();
      std::shared_ptr<ForgingView> view;
      comms = generation(P, carries, /*reuse=*/true, prefix,
                         [&](int r, std::shared_ptr<ddprun::rendezvous::Store> store)
                             -> std::shared_ptr<ddprun::rendezvous::Store> {
                           if (r != 1) return store;
                           view = std::make_shared<ForgingView>(store, forgery.suffix,
                                                                forgery.value);
                           return view;
                         });
      lent = lend(comms, region);
      REQUIRE(view);
      CHECK(view->forgedReads == 1);
      for (int r = 0; r < P; ++r) CHECK(int(marker(lent[r])) == 0);  // new memory on both
      checkInPlaceSum(comms, lent);
      // At most the replacement's check word (8 random bytes) reached the outside memory.
      CHECK(forgery.memory.zeroBut(region, forgery.written));
      comms.clear();
      lent.clear();
      CHECK(shmLeftovers(prefix) == 0);
    }
  }
}
