// Checkpoints: round trip, newest complete wins, torn and damaged files are skipped, a failed
// write (file size limit: the same EFBIG/ENOSPC path as a full disk) keeps the previous one.
#include "tests/support/catch_torch.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "base/errors.h"
#include "tests/support/temp_dir.h"
#include "worker_runtime/checkpoint.h"

using namespace ddprun::runtime;
namespace fs = std::filesystem;
using ddprun::testing::TempDir;

namespace {

struct Net : torch::nn::Module {
  explicit Net(int hidden = 16) {
    fc1 = register_module("fc1", torch::nn::Linear(8, hidden));
    bn = register_module("bn", torch::nn::BatchNorm1d(hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, 3));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(bn(fc1(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

void trainSteps(Net& net, torch::optim::Optimizer& opt, int steps) {
  torch::manual_seed(5);
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    auto loss = net.forward(torch::randn({16, 8})).pow(2).mean();
    loss.backward();
    opt.step();
  }
}

bool sameTensors(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

// A file size limit below a checkpoint's size makes write(2) fail with EFBIG, as a full disk
// fails it with ENOSPC (SIGXFSZ is ignored so the error reaches us). Undone when it goes.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_) == 0);
    oldHandler_ = ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = old_;
    small.rlim_cur = bytes;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    ::signal(SIGXFSZ, oldHandler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  struct rlimit old_ {};
  sighandler_t oldHandler_ = SIG_DFL;
};

}  // namespace

TEST_CASE("a checkpoint round trip restores model, optimizer and state", "[checkpoint]") {
  TempDir dir;
  Net a;
  torch::optim::Adam optA(a.parameters(), torch::optim::AdamOptions(1e-2));
  trainSteps(a, optA, 3);
  CheckpointManager ckpt({.directory = dir.path()});
  TrainingState st{.step = 30, .epoch = 2, .sampler = {2, 17}, .extra = {{"best", 0.75}}};
  const fs::path file = ckpt.save(a, &optA, st);
  CHECK(file.filename() == "ckpt-000000000030.ddpck");

  Net b;
  torch::optim::Adam optB(b.parameters(), torch::optim::AdamOptions(1e-2));
  auto loaded = ckpt.loadLatest(b, &optB);
  REQUIRE(loaded);
  CHECK(loaded->step == 30);
  CHECK(loaded->epoch == 2);
  CHECK(loaded->sampler.epoch == 2);
  CHECK(loaded->sampler.position == 17);
  CHECK(loaded->extra["best"] == 0.75);
  CHECK(sameTensors(a.parameters(), b.parameters()));
  CHECK(sameTensors(a.buffers(), b.buffers()));
  // Continuing from the restored optimizer gives the same weights as never stopping.
  trainSteps(a, optA, 2);
  trainSteps(b, optB, 2);
  CHECK(sameTensors(a.parameters(), b.parameters()));
}

TEST_CASE("the newest complete checkpoint wins, torn and damaged ones are skipped",
          "[checkpoint]") {
  TempDir dir;
  Net net;
  CheckpointManager ckpt({.directory = dir.path(), .keep = 5});
  for (int64_t step : {10, 20, 30}) {
    for (auto& p : net.parameters()) p.data().fill_(static_cast<float>(step));
    ckpt.save(net, nullptr, {.step = step});
  }
  CHECK(ckpt.list().size() == 3);
  const fs::path newest = ckpt.list()[0];
  const auto size = fs::file_size(newest);

  SECTION("truncated (a torn write)") { fs::resize_file(newest, size / 2); }
  SECTION("a flipped byte in the data") {
    std::fstream f(newest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size - 100));
    char c;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(size - 100));
    c ^= 0x40;
    f.write(&c, 1);
  }
  SECTION("not a checkpoint at all") { std::ofstream(newest) << "hello"; }

  Net loaded;
  auto st = ckpt.loadLatest(loaded, nullptr);
  REQUIRE(st);
  CHECK(st->step == 20);
  CHECK(loaded.fc1->weight[0][0].item<float>() == 20.0f);
  // Asked for by name, the bad file is an error that names it.
  CHECK_THROWS_WITH(CheckpointManager::load(newest, loaded, nullptr),
                    Catch::Contains(newest.string()) && Catch::Contains("torn or damaged"));
}

TEST_CASE("no checkpoint means a fresh start, leftovers of a crashed save are ignored",
          "[checkpoint]") {
  TempDir dir;
  CheckpointManager ckpt({.directory = dir.path()});
  Net net;
  CHECK_FALSE(ckpt.loadLatest(net, nullptr));
  char host[256] = {};
  REQUIRE(::gethostname(host, sizeof host - 1) == 0);
  // A writer of this host whose pid does not exist (beyond any pid_max) is gone; one that
  // runs (this process) or of another host is saving right now and is left alone.
  const std::string dead = std::string("ckpt-000000000050.ddpck.tmp-") + host + "-999999999-0123456789abcdef";
  const std::string live = std::string("ckpt-000000000051.ddpck.tmp-") + host + "-" +
                           std::to_string(::getpid()) + "-0123456789abcdef";
  const std::string other = "ckpt-000000000052.ddpck.tmp-other-host-1-0123456789abcdef";
  for (const auto& name : {dead, live, other}) std::ofstream(dir / name) << "half a file";
  CHECK_FALSE(ckpt.loadLatest(net, nullptr));
  ckpt.save(net, nullptr, {.step = 1});
  CHECK_FALSE(fs::exists(dir / dead));  // cleaned up
  CHECK(fs::exists(dir / live));
  CHECK(fs::exists(dir / other));
  // Untouched for more than an hour: gone, whoever wrote it.
  fs::last_write_time(dir / other, fs::file_time_type::clock::now() - std::chrono::hours(2));
  ckpt.save(net, nullptr, {.step = 2});
  CHECK_FALSE(fs::exists(dir / other));
  CHECK(fs::exists(dir / live));
}

TEST_CASE("a symlink planted under a temporary name is not followed", "[checkpoint]") {
  TempDir dir;
  const fs::path victim = dir / "victim";
  std::ofstream(victim) << "precious";
  fs::create_directory(dir / "ckpt");
  // The name an older version used (pid only) and a guess with this host's name.
  char host[256] = {};
  REQUIRE(::gethostname(host, sizeof host - 1) == 0);
  for (const std::string& name :
       {"ckpt-000000000005.ddpck.tmp-" + std::to_string(::getpid()),
        "ckpt-000000000005.ddpck.tmp-" + std::string(host) + "-" + std::to_string(::getpid())}) {
    fs::create_symlink(victim, fs::path(dir / "ckpt") / name);
  }
  CheckpointManager ckpt({.directory = dir / "ckpt"});
  Net net;
  ckpt.save(net, nullptr, {.step = 5});
  std::ifstream in(victim);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(content == "precious");
  Net loaded;
  CHECK(ckpt.loadLatest(loaded, nullptr)->step == 5);
}

TEST_CASE("a stray name that looks like a checkpoint does not stop a resume", "[checkpoint]") {
  TempDir dir;
  CheckpointManager ckpt({.directory = dir.path()});
  Net net;
  ckpt.save(net, nullptr, {.step = 7});
  std::ofstream(dir / "ckpt-123456789012345678901.ddpck") << "not ours";  // 21 digits
  Net loaded;
  auto st = ckpt.loadLatest(loaded, nullptr);
  REQUIRE(st);
  CHECK(st->step == 7);
  CHECK(ckpt.list().size() == 1);
}

TEST_CASE("two processes saving into one directory: every save lands, the newest wins",
          "[checkpoint]") {
  TempDir dir;
  constexpr int kSaves = 40;
  auto saveLoop = [&](int parity) {
    CheckpointManager ckpt({.directory = dir.path(), .keep = 2});
    Net net;
    int failures = 0;
    for (int i = 0; i < kSaves; ++i) {
      try {
        ckpt.save(net, nullptr, {.step = 2 * i + parity});
      } catch (const std::exception& e) {
        std::fprintf(stderr, "writer %d, save %d: %s\n", parity, i, e.what());
        ++failures;
      }
    }
    return failures;
  };
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(saveLoop(1) == 0 ? 0 : 1);
  const int parentFailures = saveLoop(0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(parentFailures == 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CheckpointManager ckpt({.directory = dir.path()});
  Net loaded;
  auto st = ckpt.loadLatest(loaded, nullptr);
  REQUIRE(st);
  CHECK(st->step >= 2 * (kSaves - 1));  // the last save of either writer
  for (auto& e : fs::directory_iterator(dir.path())) {
    INFO(e.path());
    CHECK(e.path().filename().string().find(".tmp-") == std::string::npos);
  }
}

TEST_CASE("a failed write is an error that keeps the previous checkpoint", "[checkpoint]") {
  TempDir dir;
  Net net;
  CheckpointManager ckpt({.directory = dir.path()});
  ckpt.save(net, nullptr, {.step = 1});
  const auto before = fs::file_size(ckpt.list()[0]);

  Net bigger(64);
  std::string error;
  try {
    FileSizeLimit limit(before / 2);
    CheckpointManager({.directory = dir.path()}).save(bigger, nullptr, {.step = 2});
  } catch (const CheckpointError& e) {
    error = e.what();
  }

  CHECK_THAT(error, Catch::Contains("ckpt-000000000002.ddpck") && Catch::Contains("write failed"));
  REQUIRE(ckpt.list().size() == 1);
  CHECK(ckpt.list()[0].filename() == "ckpt-000000000001.ddpck");
  CHECK(fs::file_size(ckpt.list()[0]) == before);
  for (auto& e : fs::directory_iterator(dir.path())) {
    CHECK(e.path().filename().string().find(".tmp-") == std::string::npos);  // no temp left
  }
  Net loaded;
  CHECK(ckpt.loadLatest(loaded, nullptr)->step == 1);
}

TEST_CASE("retention keeps the newest `keep` checkpoints", "[checkpoint]") {
  TempDir dir;
  Net net;
  CheckpointManager ckpt({.directory = dir.path(), .keep = 2});
  for (int64_t s = 1; s <= 5; ++s) ckpt.save(net, nullptr, {.step = s});
  auto files = ckpt.list();
  REQUIRE(files.size() == 2);
  CHECK(CheckpointManager::inspect(files[0]).step == 5);
  CHECK(CheckpointManager::inspect(files[1]).step == 4);
}

TEST_CASE("a checkpoint of another model is refused with the parameter named", "[checkpoint]") {
  TempDir dir;
  CheckpointManager ckpt({.directory = dir.path()});
  Net small(16);
  ckpt.save(small, nullptr, {.step = 1});
  Net other(32);
  std::vector<torch::Tensor> before;
  for (const auto& t : other.parameters()) before.push_back(t.clone());
  CHECK_THROWS_WITH(ckpt.loadLatest(other, nullptr),
                    Catch::Contains("does not fit this model") && Catch::Contains("fc1.weight") &&
                        Catch::Contains("ckpt-000000000001"));
  CHECK(sameTensors(before, other.parameters()));  // a refused checkpoint changes nothing
  torch::optim::SGD sgd(small.parameters(), 0.1);
  CHECK_THROWS_WITH(ckpt.loadLatest(small, &sgd), Catch::Contains("no optimizer state"));
  CHECK_THROWS_AS(CheckpointManager({.directory = dir.path(), .keep = 0}), ddprun::ConfigError);
}

TEST_CASE("loading copies into the model's own tensors (a DDP built on them stays valid)",
          "[checkpoint]") {
  TempDir dir;
  CheckpointManager ckpt({.directory = dir.path()});
  Net a;
  ckpt.save(a, nullptr, {.step = 4});
  Net b;
  std::vector<const void*> storage;
  for (const auto& t : b.parameters()) storage.push_back(t.data_ptr());
  for (const auto& t : b.buffers()) storage.push_back(t.data_ptr());
  REQUIRE(ckpt.loadLatest(b, nullptr));
  size_t i = 0;
  for (const auto& t : b.parameters()) CHECK(t.data_ptr() == storage[i++]);
  for (const auto& t : b.buffers()) CHECK(t.data_ptr() == storage[i++]);
  CHECK(sameTensors(a.parameters(), b.parameters()));
  CHECK(sameTensors(a.buffers(), b.buffers()));
}

TEST_CASE("a background save holds the values at the call while training goes on",
          "[checkpoint]") {
  TempDir dir;
  Net a;
  torch::optim::Adam optA(a.parameters(), torch::optim::AdamOptions(1e-2));
  trainSteps(a, optA, 3);
  std::vector<torch::Tensor> atCall;
  for (const auto& p : a.parameters()) atCall.push_back(p.detach().clone());
  CheckpointManager ckpt({.directory = dir.path()});
  ckpt.saveInBackground(a, &optA, {.step = 3, .epoch = 1, .sampler = {1, 48}});
  trainSteps(a, optA, 2);  // in place, while the file may still be written
  const auto file = ckpt.flush();
  REQUIRE(file);
  CHECK(file->filename() == "ckpt-000000000003.ddpck");
  CHECK_FALSE(ckpt.flush());  // nothing in flight any more

  Net b;
  torch::optim::Adam optB(b.parameters(), torch::optim::AdamOptions(1e-2));
  const auto loaded = ckpt.loadLatest(b, &optB);
  REQUIRE(loaded);
  CHECK(loaded->step == 3);
  CHECK(loaded->sampler.position == 48);
  CHECK(sameTensors(b.parameters(), atCall));
  CHECK_FALSE(sameTensors(b.parameters(), a.parameters()));
  // The optimizer state is the call's too: two more steps from it reach a's weights.
  trainSteps(b, optB, 2);
  CHECK(sameTensors(a.parameters(), b.parameters()));
}

TEST_CASE("a background save that fails is thrown by the next call and keeps the previous "
          "checkpoint",
          "[checkpoint]") {
  TempDir dir;
  Net net;
  CheckpointManager ckpt({.directory = dir.path()});
  ckpt.saveInBackground(net, nullptr, {.step = 1});
  ckpt.saveInBackground(net, nullptr, {.step = 2});  // waits for step 1's write first
  REQUIRE(ckpt.flush());
  const auto before = fs::file_size(ckpt.list()[0]);

  Net bigger(64);
  std::string error;
  {
    FileSizeLimit limit(before / 2);
    ckpt.saveInBackground(bigger, nullptr, {.step = 3});  // serialized here, written later
    try {
      ckpt.saveInBackground(bigger, nullptr, {.step = 4});
    } catch (const CheckpointError& e) {
      error = e.what();
    }
  }

  CHECK_THAT(error, Catch::Contains("ckpt-000000000003.ddpck") && Catch::Contains("write failed"));
  CHECK_FALSE(ckpt.flush());  // step 4 was not started: the error stopped it
  const auto files = ckpt.list();
  REQUIRE(files.size() == 2);
  CHECK(files[0].filename() == "ckpt-000000000002.ddpck");
  CHECK(fs::file_size(files[0]) == before);
  for (auto& e : fs::directory_iterator(dir.path())) {
    CHECK(e.path().filename().string().find(".tmp-") == std::string::npos);  // no temp left
  }
  // The manager saves again once the disk takes it.
  ckpt.saveInBackground(net, nullptr, {.step = 5});
  const auto fifth = ckpt.flush();
  REQUIRE(fifth);
  CHECK(fifth->filename() == "ckpt-000000000005.ddpck");
}

TEST_CASE("a manager that goes away finishes its background save first", "[checkpoint]") {
  TempDir dir;
  Net net;
  {
    CheckpointManager ckpt({.directory = dir.path()});
    ckpt.saveInBackground(net, nullptr, {.step = 7});
  }
  Net loaded;
  const auto state = CheckpointManager({.directory = dir.path()}).loadLatest(loaded, nullptr);
  REQUIRE(state);
  CHECK(state->step == 7);
  CHECK(sameTensors(net.parameters(), loaded.parameters()));
}

TEST_CASE("a rehearsed save writes nothing and serializes what a save would", "[checkpoint]") {
  TempDir dir;
  Net a(64);
  torch::optim::SGD opt(a.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  trainSteps(a, opt, 2);  // the momentum buffers exist: the optimizer's state is in the archive
  const size_t rehearsed = CheckpointManager::rehearseSave(a, &opt);
  CHECK(fs::is_empty(dir.path()));
  CHECK(CheckpointManager::rehearseSave(a, &opt) == rehearsed);
  // The tensors alone: parameters, buffers and one momentum buffer per parameter (float32).
  size_t tensorBytes = 0;
  for (const auto& p : a.parameters()) tensorBytes += 2 * p.nbytes();
  for (const auto& b : a.buffers()) tensorBytes += b.nbytes();
  CHECK(rehearsed > tensorBytes);
  // A real save of the same model holds that archive plus a header and the metadata.
  CheckpointManager ckpt({.directory = dir.path()});
  const fs::path file = ckpt.save(a, &opt, TrainingState{.step = 3});
  const auto fileBytes = static_cast<size_t>(fs::file_size(file));
  CHECK(fileBytes > rehearsed);
  CHECK(fileBytes - rehearsed < 4096);
  Net b(64);
  torch::optim::SGD optB(b.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  REQUIRE(ckpt.loadLatest(b, &optB));
  CHECK(sameTensors(a.parameters(), b.parameters()));
}
