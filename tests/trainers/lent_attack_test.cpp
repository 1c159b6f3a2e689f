// Attack on the real binaries (docs/security.md, "lent buffer offers"): while the real mnist_mlp
// recovers in process under the real ddprun, a hostile client of the agent's store (which never
// authenticates: PyTorch's client could not) rewrites the survivor's offer of its lent buffer
// (worker_runtime/shm/lent_carry.h) to name memory of its own, of the right size. The buffer
// holds DDP's gradients: mapped by one rank and not the others, the job would train on wrong
// sums, and whoever holds the memory would read and write them.
//
// Checked: the job finishes with the weights of an uninterrupted run, the forged memory stays
// untouched, and when the forgery was read (the usual case: it lands before the spare's offer)
// every rank mapped a new buffer, with one line naming the replaced offer.
#include "tests/support/catch_torch.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>
#include <thread>

#include <nlohmann/json.hpp>

#include "fashion_mnist.h"
#include "job_runner.h"
#include "rendezvous/tcp_store.h"
#include "test_files.h"
#include "trained_weights.h"
#include "tests/support/process.h"
#include "worker_runtime/shm/lent_carry.h"

using namespace ddprun::trainers;
using namespace ddprun::trainers::testing;
using Catch::Matchers::Contains;

namespace {

constexpr auto kJobTimeout = std::chrono::seconds(120);
constexpr int kEpochs = 8;  // 1024 steps: the spare loads long before the job ends

std::vector<std::string> job(const std::string& dir, std::vector<std::string> flags) {
  return standaloneJob(2, mlpCommand({.dir = dir, .batch = 16, .epochs = kEpochs}), flags);
}

// Generation 1's first lend in the agent's store: the attempt's scope, the generation's, the
// first shm communicator's (worker_runtime/runtime.cpp, shm_communicator.cpp).
const std::string kLend = "/worker/attempt_0/gen/1/shm/1/lend/0/";

// The attacker's memory: a memfd of `bytes` zeros.
struct ForgedMemory {
  explicit ForgedMemory(size_t bytes)
      : fd(::memfd_create("forged-lent-buffer", MFD_CLOEXEC)), bytes(bytes) {
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, static_cast<off_t>(bytes)) == 0);
  }
  ~ForgedMemory() { ::close(fd); }
  // The offer that names it (this process's pid and descriptor).
  std::string offer() const {
    struct stat st {};
    REQUIRE(::fstat(fd, &st) == 0);
    namespace shm = ddprun::runtime::shm;
    return shm::formatOffer(shm::LentOffer{
        .file = {.device = static_cast<uint64_t>(st.st_dev),
                 .inode = static_cast<uint64_t>(st.st_ino)},
        .bytes = bytes, .pid = ::getpid(), .fd = fd});
  }
  bool untouched() const {
    void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    REQUIRE(p != MAP_FAILED);
    const auto* b = static_cast<const uint8_t*>(p);
    bool zero = true;
    for (size_t i = 0; i < bytes && zero; ++i) zero = b[i] == 0;
    ::munmap(p, bytes);
    return zero;
  }
  int fd;
  size_t bytes;
};

// The "lend buffer" spans of a --timeline trace, in its order.
std::vector<nlohmann::json> lendSpans(const std::filesystem::path& path) {
  std::ifstream in(path);
  REQUIRE(in);
  const auto trace = nlohmann::json::parse(in);
  const auto& events = trace.is_object() ? trace.at("traceEvents") : trace;
  std::vector<nlohmann::json> lends;
  for (const auto& e : events) {
    if (e.value("name", "") == "lend buffer") lends.push_back(e);
  }
  return lends;
}

}  // namespace

TEST_CASE("a hostile store client rewrites the survivor's lent-buffer offer to name its own "
          "memory during an in-process recovery: every rank maps a new buffer, the forged memory "
          "is never written, weights bit-identical",
          "[elastic][recovery][spares][security][slow]") {
  if (!haveData()) return skipWithoutData();
  TempDir reference;
  {
    Job j(job(reference.path(), {"--timeline=" + (reference / "timeline.json")}), {},
          reference / "log");
    const int code = j.wait(kJobTimeout);
    INFO(j.output());
    REQUIRE(code == 0);
  }
  // The size the survivor will offer: the lent buffer's, one page-rounded region per rank.
  const auto lends = lendSpans(reference / "timeline.json");
  REQUIRE(!lends.empty());
  const int64_t asked = lends[0]["args"].value("bytes", int64_t{0});
  REQUIRE(asked > 0);
  ForgedMemory forged(static_cast<size_t>((asked + 4095) / 4096 * 4096 * 2));
  TempDir dir;
  std::string attackError;
  std::vector<std::string> genuine;  // what the survivor wrote, once the attacker saw it
  std::atomic<bool> stop{false};
  std::string output;
  {
    Job j(job(dir.path(), {"--max-restarts=1", "--recovery=in-process", "--spares=1",
                           "--timeline=" + (dir / "timeline.json")}),
          {}, dir / "log");
    REQUIRE(showingOutput(waitForOutput(j, "ready: loaded, waiting for a rank", kJobTimeout), j));
    const pid_t rank0 = workerPid(j.pid(), 0, "mnist_mlp");
    const pid_t victim = workerPid(j.pid(), 1, "mnist_mlp");
    REQUIRE(rank0 > 0);
    REQUIRE(victim > 0);
    const auto client = workerStore(rank0);
    ddprun::rendezvous::TcpStore& store = *client;
    // Written before the generation exists: a spare that offers first reads it at once. Then
    // the survivor's own offer, each time it appears, is replaced as fast as the store answers.
    // The survivor writes its offer once: the attacker is done once it replaced it.
    const std::string forgedOffer = forged.offer();
    store.set(kLend + "offer/0", forgedOffer);
    std::thread attacker([&] {
      try {
        while (!stop && genuine.empty()) {
          const std::string now = store.get(kLend + "offer/0");
          if (now != forgedOffer) {
            store.set(kLend + "offer/0", forgedOffer);
            genuine.push_back(now);
          }
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
      } catch (const std::exception& e) {
        attackError = e.what();
      }
    });
    REQUIRE(::kill(victim, SIGKILL) == 0);
    const int code = j.wait(kJobTimeout);
    stop = true;
    attacker.join();
    output = j.output();
    INFO(output);
    REQUIRE(code == 0);
  }
  INFO(output);
  INFO("the attacker: " << attackError);
  REQUIRE(attackError.empty());
  // The survivor's offer was seen (the key is where this test expects it) and named memory of
  // the size forged (so the forgery was the one offer a replacement would open).
  REQUIRE(!genuine.empty());
  const auto offer = ddprun::runtime::shm::parseOffer(genuine[0]);
  REQUIRE(offer);
  CHECK(offer->bytes == forged.bytes);
  CHECK(forged.untouched());
  CHECK_THAT(output, Contains("done: 1024 steps"));
  CHECK(bitIdentical(loadWeights(dir / "final.pt"), loadWeights(reference / "final.pt")));
  // Generation 1's lends: reused only if both ranks read the offers between the survivor's
  // write and the attacker's rewrite (tens of microseconds).
  const auto lent = lendSpans(dir / "timeline.json");
  CHECK(lent.size() == 4);  // two ranks, two generations
  int reused = 0;
  for (const auto& e : lent) reused += e.contains("args") && e["args"].value("reused", 0) == 1;
  const bool refused =
      output.find("its offer in the store was replaced by '" + forged.offer()) !=
          std::string::npos ||
      output.find("'s offer names pid " + std::to_string(::getpid())) != std::string::npos;
  std::cerr << "lent attack: the forgery was " << (refused ? "read and refused" : "too late")
            << ", generation 1's lends reused: " << reused << "\n";
  CHECK(reused == (refused ? 0 : 2));
}
