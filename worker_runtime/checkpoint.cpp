#include "worker_runtime/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <csignal>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string_view>

#include "base/log.h"
#include "base/timeline.h"
#include "base/unique_fd.h"
#include "worker_runtime/communicator.h"

namespace ddprun::runtime {
namespace fs = std::filesystem;
namespace {

// Layout (little-endian): magic[8] "DDPRUNCK", u32 version, u32 flags (0), u64 metaLen,
// u64 payloadLen, u32 metaCrc, u32 payloadCrc, u32 headerCrc (of the 40 bytes before it),
// then meta (JSON), payload (torch archive), end magic "DDPRUNCK-END".
constexpr char kMagic[8] = {'D', 'D', 'P', 'R', 'U', 'N', 'C', 'K'};
constexpr char kEnd[12] = {'D', 'D', 'P', 'R', 'U', 'N', 'C', 'K', '-', 'E', 'N', 'D'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 44;

// An integrity failure: the file is torn or damaged, so loadLatest() may skip it.
class TornCheckpoint : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

uint32_t crc(const char* p, size_t n) {
  uLong c = crc32(0L, Z_NULL, 0);
  while (n > 0) {  // zlib takes uInt lengths
    const uInt chunk = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    c = crc32(c, reinterpret_cast<const Bytef*>(p), chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(c);
}

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
T take(const std::string& in, size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof(T));
  return v;
}

std::string fileName(int64_t step) {
  char name[64];
  std::snprintf(name, sizeof(name), "ckpt-%012lld.ddpck", static_cast<long long>(step));
  return name;
}

// Temporary names: "<final name>.tmp-<host>-<pid>-<16 hex digits>". Host and pid tell whose
// it is (several hosts may share the directory), the random part makes it unguessable: it is
// created with O_EXCL | O_NOFOLLOW, so a file or symlink planted under that name fails the
// save instead of being followed and truncated.
constexpr std::string_view kTempMarker = ".ddpck.tmp-";
// A temporary file untouched for this long belongs to a writer that is gone (a writer
// touches it with every write), whoever it was.
constexpr auto kStaleTemporary = std::chrono::hours(1);

std::string hostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') return "unknown-host";
  return host;
}

std::string randomHex() {
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// True when `name` is a temporary file of a writer that is certainly gone: one on this host
// whose pid no longer exists, or any that has not been written to for kStaleTemporary.
bool staleTemporary(const fs::directory_entry& entry, const std::string& name,
                    const std::string& host) {
  const auto at = name.find(kTempMarker);
  if (at == std::string::npos) return false;
  std::error_code ec;
  const auto mtime = entry.last_write_time(ec);
  if (!ec && fs::file_time_type::clock::now() - mtime > kStaleTemporary) return true;
  // "<host>-<pid>-<random>", or "<pid>" as older versions wrote it (on this host, then).
  const std::string owner = name.substr(at + kTempMarker.size());
  std::string ownerHost = host, pidText = owner;
  const auto last = owner.rfind('-');
  if (last != std::string::npos) {
    const auto prev = owner.rfind('-', last - 1);
    if (last == 0 || prev == std::string::npos) return false;
    ownerHost = owner.substr(0, prev);
    pidText = owner.substr(prev + 1, last - prev - 1);
  }
  if (ownerHost != host || pidText.empty() || pidText.size() > 9) return false;
  for (char c : pidText) {
    if (c < '0' || c > '9') return false;
  }
  const pid_t pid = static_cast<pid_t>(std::stol(pidText));
  return pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH;
}

[[noreturn]] void ioFail(const std::string& what, const fs::path& file, int err) {
  throw CheckpointError("checkpoint " + file.string() + ": " + what + ": " + std::strerror(err));
}

// Writes all bytes, retrying short writes and EINTR.
void writeAll(int fd, const std::string& data, const fs::path& file) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) ioFail("write failed", file, errno);
    if (n == 0) ioFail("write made no progress", file, ENOSPC);
    done += static_cast<size_t>(n);
  }
}

void fsyncDir(const fs::path& dir) {
  const UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) ioFail("cannot open the directory to fsync it", dir, errno);
  if (::fsync(fd.get()) != 0) ioFail("fsync of the directory failed", dir, errno);
}

nlohmann::json toJson(const TrainingState& s, bool hasOptimizer) {
  return {{"format", "ddprun-checkpoint"},
          {"version", kVersion},
          {"step", s.step},
          {"epoch", s.epoch},
          {"sampler",
           {{"epoch", s.sampler.epoch},
            {"global_position", s.sampler.position},
            {"dataset_size", s.sampler.datasetSize}}},
          {"world_size", s.worldSize},
          {"has_optimizer", hasOptimizer},
          {"extra", s.extra}};
}

// Reads and verifies a whole file; returns the metadata and the payload.
std::pair<nlohmann::json, std::string> readVerified(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw CheckpointError("checkpoint " + file.string() + ": cannot open: " + std::strerror(errno));
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto torn = [&](const std::string& why) {
    return TornCheckpoint("checkpoint " + file.string() + " is torn or damaged: " + why);
  };
  if (all.size() < kHeaderBytes + sizeof(kEnd)) {
    throw torn("only " + std::to_string(all.size()) + " bytes");
  }
  if (std::memcmp(all.data(), kMagic, sizeof(kMagic)) != 0) {
    throw torn("it does not start with DDPRUNCK (not a ddprun checkpoint)");
  }
  if (take<uint32_t>(all, 40) != crc(all.data(), 40)) throw torn("header checksum mismatch");
  const uint32_t version = take<uint32_t>(all, 8);
  if (version != kVersion) {
    throw CheckpointError("checkpoint " + file.string() + " has format version " +
                          std::to_string(version) + "; this ddprun reads version " +
                          std::to_string(kVersion));
  }
  const uint64_t metaLen = take<uint64_t>(all, 16);
  const uint64_t payloadLen = take<uint64_t>(all, 24);
  const uint64_t expected = kHeaderBytes + metaLen + payloadLen + sizeof(kEnd);
  if (metaLen > all.size() || payloadLen > all.size() || all.size() != expected) {
    throw torn("size is " + std::to_string(all.size()) + " bytes, the header says " +
               std::to_string(expected));
  }
  if (std::memcmp(all.data() + expected - sizeof(kEnd), kEnd, sizeof(kEnd)) != 0) {
    throw torn("end marker missing");
  }
  const char* meta = all.data() + kHeaderBytes;
  const char* payload = meta + metaLen;
  if (crc(meta, metaLen) != take<uint32_t>(all, 32)) throw torn("metadata checksum mismatch");
  if (crc(payload, payloadLen) != take<uint32_t>(all, 36)) throw torn("data checksum mismatch");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(meta, meta + metaLen);
  } catch (const std::exception& e) {
    throw torn(std::string("metadata is not JSON: ") + e.what());
  }
  return {std::move(j), std::string(payload, payloadLen)};
}

TrainingState stateFrom(const nlohmann::json& j, const fs::path& file) {
  try {
    TrainingState s;
    s.step = j.at("step").get<int64_t>();
    s.epoch = j.at("epoch").get<int64_t>();
    const auto& sampler = j.at("sampler");
    s.sampler.epoch = sampler.at("epoch").get<int64_t>();
    if (!sampler.contains("global_position")) {
      // Written before the position became global: a per-rank index of an unknown world size.
      throw IncompatibleCheckpoint(
          "checkpoint " + file.string() +
          " was written by an older ddprun (its sampler position is per rank, and the world size "
          "is not recorded): it cannot be resumed; move it away to start over");
    }
    s.sampler.position = sampler.at("global_position").get<size_t>();
    s.sampler.datasetSize = sampler.value("dataset_size", size_t{0});
    s.worldSize = j.value("world_size", 0);
    s.extra = j.value("extra", nlohmann::json::object());
    return s;
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError("checkpoint " + file.string() + ": bad metadata: " + e.what());
  }
}

}  // namespace

CheckpointManager::CheckpointManager(CheckpointOptions options) : options_(std::move(options)) {
  if (options_.directory.empty()) throw ConfigError("checkpoint directory is empty");
  if (options_.keep < 1) {
    throw ConfigError("checkpoint keep=" + std::to_string(options_.keep) + " must be >= 1");
  }
  std::error_code ec;
  fs::create_directories(options_.directory, ec);
  if (ec || !fs::is_directory(options_.directory)) {
    throw CheckpointError("checkpoint directory " + options_.directory.string() +
                          " cannot be created: " + (ec ? ec.message() : "not a directory"));
  }
}

CheckpointManager::~CheckpointManager() {
  try {
    flush();
  } catch (const std::exception& e) {
    DDPRUN_LOG(ERROR, "checkpoint") << "the last background save failed: " << e.what();
  }
}

CheckpointManager::Serialized CheckpointManager::serialize(const torch::nn::Module& model,
                                                           const torch::optim::Optimizer* optimizer,
                                                           const TrainingState& state,
                                                           size_t reserve) {
  if (state.step < 0) throw ConfigError("checkpoint step " + std::to_string(state.step) + " < 0");
  torch::serialize::OutputArchive archive;
  torch::serialize::OutputArchive modelArchive;
  model.save(modelArchive);
  archive.write("model", modelArchive);
  if (optimizer) {
    torch::serialize::OutputArchive optimArchive;
    optimizer->save(optimArchive);
    archive.write("optimizer", optimArchive);
  }
  Serialized s{.step = state.step, .meta = toJson(state, optimizer != nullptr).dump()};
  // Into one buffer sized from the last save: no regrowth, no copy out of a stream.
  s.payload.reserve(reserve + reserve / 8 + 4096);
  archive.save_to([&s](const void* data, size_t n) {
    s.payload.append(static_cast<const char*>(data), n);
    return n;
  });
  return s;
}

size_t CheckpointManager::rehearseSave(const torch::nn::Module& model,
                                       const torch::optim::Optimizer* optimizer) {
  // Twice: the second, sized from the first, allocates what a save after the first does.
  const size_t bytes = serialize(model, optimizer, TrainingState{}, 0).payload.size();
  return serialize(model, optimizer, TrainingState{}, bytes).payload.size();
}

fs::path CheckpointManager::save(const torch::nn::Module& model,
                                 const torch::optim::Optimizer* optimizer,
                                 const TrainingState& state) {
  ddprun::timeline::Scope span("checkpoint save", "checkpoint");
  span.args().add("step", state.step);
  flush();  // a background write of an earlier step lands first
  Serialized serialized = serialize(model, optimizer, state, lastPayloadBytes_);
  lastPayloadBytes_ = serialized.payload.size();
  return write(serialized);
}

void CheckpointManager::saveInBackground(const torch::nn::Module& model,
                                         const torch::optim::Optimizer* optimizer,
                                         const TrainingState& state) {
  ddprun::timeline::Scope span("checkpoint save", "checkpoint");
  span.args().add("step", state.step).add("background", 1);
  flush();
  auto serialized = serialize(model, optimizer, state, lastPayloadBytes_);
  lastPayloadBytes_ = serialized.payload.size();
  pending_ = std::async(std::launch::async, [this, s = std::move(serialized)] {
    ddprun::timeline::Scope writeSpan("checkpoint write", "checkpoint");
    writeSpan.args().add("step", s.step);
    return write(s);
  });
}

std::optional<fs::path> CheckpointManager::flush() {
  if (!pending_.valid()) return std::nullopt;
  return pending_.get();  // get() leaves the future invalid, even when it throws
}

fs::path CheckpointManager::write(const Serialized& s) const {
  const std::string& meta = s.meta;
  const std::string& payload = s.payload;
  std::string bytes;
  bytes.reserve(kHeaderBytes + meta.size() + payload.size() + sizeof(kEnd));
  bytes.append(kMagic, sizeof(kMagic));
  put<uint32_t>(bytes, kVersion);
  put<uint32_t>(bytes, 0);
  put<uint64_t>(bytes, meta.size());
  put<uint64_t>(bytes, payload.size());
  put<uint32_t>(bytes, crc(meta.data(), meta.size()));
  put<uint32_t>(bytes, crc(payload.data(), payload.size()));
  put<uint32_t>(bytes, crc(bytes.data(), bytes.size()));
  bytes += meta;
  bytes += payload;
  bytes.append(kEnd, sizeof(kEnd));

  const fs::path dir = options_.directory;
  const fs::path final = dir / fileName(s.step);
  const std::string host = hostName();
  const fs::path tmp = dir / (fileName(s.step) + ".tmp-" + host + "-" +
                              std::to_string(::getpid()) + "-" + randomHex());
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd) ioFail("cannot create the temporary file " + tmp.filename().string(), final, errno);
  try {
    writeAll(fd.get(), bytes, final);
    if (::fsync(fd.get()) != 0) ioFail("fsync failed", final, errno);
    if (fd.close() != 0) ioFail("close failed", final, errno);  // closed either way, once
  } catch (...) {
    fd.reset();
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), final.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    ioFail("rename failed", final, err);
  }
  fsyncDir(dir);

  // Retention, and temporary files left by a crash during an earlier save -- only those
  // of writers that are gone: another process may be saving into this directory right now.
  const auto all = list();
  for (size_t i = static_cast<size_t>(options_.keep); i < all.size(); ++i) {
    std::error_code ec;
    fs::remove(all[i], ec);
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (staleTemporary(entry, name, host)) {
      std::error_code rec;
      fs::remove(entry.path(), rec);
    }
  }
  return final;
}

std::vector<fs::path> CheckpointManager::list() const {
  static const std::regex kName(R"(ckpt-(\d+)\.ddpck)");
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(options_.directory, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, kName)) continue;
    // A name this version never writes (a step beyond int64, e.g. 21 digits) is not ours.
    int64_t step = 0;
    const std::string digits = m[1];
    const auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
    if (err != std::errc() || end != digits.data() + digits.size()) {
      DDPRUN_LOG(WARN, "checkpoint") << "ignoring " << entry.path().string()
                                     << ": not a step number ddprun writes";
      continue;
    }
    found.emplace_back(step, entry.path());
  }
  std::sort(found.begin(), found.end(), [](auto& a, auto& b) { return a.first > b.first; });
  std::vector<fs::path> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

TrainingState CheckpointManager::inspect(const fs::path& file) {
  return stateFrom(readVerified(file).first, file);
}

namespace {

struct LoadedTensor {
  std::string name;
  torch::Tensor mine;    // the model's tensor
  torch::Tensor theirs;  // the checkpoint's value
};

// Reads every parameter and buffer of `module` (recursively, in Module::save's nested layout)
// from `archive` into `out`, keyed by their dotted names, without touching the module.
void readModuleTensors(torch::nn::Module& module, torch::serialize::InputArchive& archive,
                       const std::string& prefix,
                       std::vector<LoadedTensor>& out) {
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    torch::Tensor t;
    archive.read(p.key(), t);
    out.push_back({prefix + p.key(), p.value(), t});
  }
  for (const auto& b : module.named_buffers(/*recurse=*/false)) {
    torch::Tensor t;
    archive.read(b.key(), t, /*is_buffer=*/true);
    out.push_back({prefix + b.key(), b.value(), t});
  }
  for (const auto& c : module.named_children()) {
    torch::serialize::InputArchive child;
    archive.read(c.key(), child);
    readModuleTensors(*c.value(), child, prefix + c.key() + ".", out);
  }
}

}  // namespace

TrainingState CheckpointManager::load(const fs::path& file, torch::nn::Module& model,
                                      torch::optim::Optimizer* optimizer) {
  auto [meta, payload] = readVerified(file);
  TrainingState state = stateFrom(meta, file);
  try {
    torch::serialize::InputArchive archive;
    std::istringstream in(payload);
    archive.load_from(in);
    torch::serialize::InputArchive modelArchive;
    archive.read("model", modelArchive);
    // Read everything first and check every shape, then copy values into the model's own
    // tensors. LibTorch's Module::load would instead swap the tensors' storage (set_), which
    // breaks a DistributedDataParallel already built on them, and would leave a half-loaded
    // model behind when a later tensor does not fit.
    std::vector<LoadedTensor> loaded;
    readModuleTensors(model, modelArchive, "", loaded);
    for (const auto& [name, mine, theirs] : loaded) {
      if (mine.sizes() != theirs.sizes() || mine.scalar_type() != theirs.scalar_type()) {
        throw IncompatibleCheckpoint("does not fit this model: " + name + " has shape " + c10::str(theirs.sizes()) + " (" +
                              c10::toString(theirs.scalar_type()) + ") in the checkpoint, " +
                              c10::str(mine.sizes()) + " (" + c10::toString(mine.scalar_type()) +
                              ") in the model");
      }
    }
    if (optimizer && !meta.value("has_optimizer", false)) {
      throw IncompatibleCheckpoint("it holds no optimizer state");
    }
    {
      torch::NoGradGuard noGrad;
      for (auto& t : loaded) t.mine.copy_(t.theirs);
    }
    if (optimizer) {
      torch::serialize::InputArchive optimArchive;
      archive.read("optimizer", optimArchive);
      optimizer->load(optimArchive);
    }
  } catch (const IncompatibleCheckpoint& e) {
    throw IncompatibleCheckpoint("checkpoint " + file.string() + ": " + e.what());
  } catch (const CheckpointError& e) {
    throw CheckpointError("checkpoint " + file.string() + ": " + e.what());
  } catch (const std::exception& e) {
    throw IncompatibleCheckpoint("checkpoint " + file.string() +
                                 " does not fit this model/optimizer: " + e.what());
  }
  return state;
}

std::optional<TrainingState> CheckpointManager::loadLatest(torch::nn::Module& model,
                                                           torch::optim::Optimizer* optimizer,
                                                           Communicator* comm) {
  ddprun::timeline::Scope span("checkpoint load", "checkpoint");
  try {
    flush();  // this process's own newest save is a candidate
  } catch (const CheckpointError& e) {
    DDPRUN_LOG(WARN, "checkpoint") << "loading the newest earlier checkpoint: " << e.what();
  }
  auto newestComplete = [&]() -> std::optional<fs::path> {
    for (const auto& file : list()) {
      try {
        readVerified(file);
        return file;
      } catch (const TornCheckpoint& e) {
        DDPRUN_LOG(WARN, "checkpoint") << "skipping " << e.what();
      }
    }
    return std::nullopt;
  };
  if (!comm || comm->size() == 1) {
    auto file = newestComplete();
    if (!file) return std::nullopt;
    return load(*file, model, optimizer);
  }
  // Rank 0 chooses; everyone loads the same step.
  torch::Tensor step = torch::full({1}, int64_t{-1}, torch::kInt64);
  if (comm->rank() == 0) {
    if (auto file = newestComplete()) step[0] = inspect(*file).step;
  }
  torch::Tensor onDevice = step.to(comm->device());
  comm->broadcast(onDevice, 0);
  step = onDevice.to(torch::kCPU);
  const int64_t chosen = step.item<int64_t>();
  if (chosen < 0) return std::nullopt;
  const fs::path file = options_.directory / fileName(chosen);
  try {
    return load(file, model, optimizer);
  } catch (const IncompatibleCheckpoint&) {
    throw;  // the same on every rank: not a question of which directory it sees
  } catch (const CheckpointError& e) {
    throw CheckpointError(std::string(e.what()) + " (rank 0 chose this checkpoint; every rank must "
                          "see the same checkpoint directory)");
  }
}

}  // namespace ddprun::runtime
