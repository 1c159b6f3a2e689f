// Lent buffers carried from one generation to the next (worker_runtime/shm/lent_carry.h): the
// offers' text, the choice every rank makes from them, and ranks as threads of this process
// that lend, drop their communicators as a recovery does, and lend again in a "next
// generation" where one rank comes with nothing (the replacement). The multi-process case (real
// survivors and a spare under ddprun, through /proc/<pid>/fd) is the hot-spare e2e tests'.
#include "tests/support/catch_torch.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

#include "base/errors.h"
#include "rendezvous/memory_store.h"
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
std::vector<std::shared_ptr<Communicator>> generation(
    int P, const std::vector<std::shared_ptr<shm::LentCarry>>& carries, bool reuse,
    const std::string& prefix) {
  auto store = std::make_shared<MemoryStore>(std::chrono::seconds(20));
  std::vector<std::shared_ptr<Communicator>> comms(P);
  runRanks(P, [&](int r) {
    comms[r] = shm::makeShmCommunicator(store, {.rank = r,
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

uint8_t marker(const torch::Tensor& lent) { return lent.data_ptr<uint8_t>()[0]; }

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
  CHECK_FALSE(shm::chooseCarried(Offers{bigger, bigger}, 8192));
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
    lent[r].narrow(0, 0, 1).fill_(static_cast<uint8_t>(10 + r));  // each region's first byte
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

TEST_CASE("shm lent buffer carried: a replacement that cannot map what the survivors carry "
          "makes every rank map a new one", "[shm]") {
  const std::string prefix = uniqueShmPrefix("carry-test");
  const int P = 2;
  std::vector<std::shared_ptr<shm::LentCarry>> carries{std::make_shared<shm::LentCarry>(),
                                                       std::make_shared<shm::LentCarry>()};
  auto comms = generation(P, carries, /*reuse=*/false, prefix);
  auto lent = lend(comms, 1 << 20);
  lent[0].narrow(0, 0, 1).fill_(uint8_t{77});
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
