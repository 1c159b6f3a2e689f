#include "base/timeline.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "base/log.h"

namespace ddprun::timeline {
namespace {

// The process's one track. `fd` is written only by open()/close(); events read it after
// checking `on` (acquire), so an event never sees a half-opened track.
struct Track {
  std::atomic<bool> on{false};
  int fd = -1;
  int64_t pid = 0;
  std::atomic<uint64_t> bytes{0};
  uint64_t maxBytes = 64ull << 20;
  std::atomic<bool> capped{false};
  std::mutex openMu;
  bool opened = false;  // open() was called (successfully or not)
};

Track& track() {
  static Track t;
  return t;
}

int64_t threadId() {
  thread_local const int64_t tid = static_cast<int64_t>(::syscall(SYS_gettid));
  return tid;
}

// One line, one write(2): O_APPEND makes it atomic against the process's other threads.
void writeLine(Track& t, const std::string& line) {
  const uint64_t after = t.bytes.fetch_add(line.size(), std::memory_order_relaxed) + line.size();
  if (after > t.maxBytes) {
    if (!t.capped.exchange(true)) {
      const std::string note =
          "{\"name\":\"timeline: events dropped (file cap reached)\",\"cat\":\"timeline\","
          "\"ph\":\"i\",\"s\":\"p\",\"ts\":" + std::to_string(nowUs()) + ",\"pid\":" +
          std::to_string(t.pid) + ",\"tid\":" + std::to_string(threadId()) + ",\"args\":{\"cap_bytes\":" +
          std::to_string(t.maxBytes) + "}}\n";
      (void)!::write(t.fd, note.data(), note.size());
    }
    return;
  }
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(t.fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a full disk loses events, never the job
    done += static_cast<size_t>(n);
  }
}

std::string event(std::string_view ph, std::string_view name, std::string_view category,
                  int64_t ts) {
  std::string line;
  line.reserve(160);
  line += "{\"name\":";
  line += quoted(name);
  line += ",\"cat\":";
  line += quoted(category);
  line += ",\"ph\":\"";
  line += ph;
  line += "\",\"ts\":";
  line += std::to_string(ts);
  return line;
}

std::string tail(const Track& t, const Args& args, int64_t tid = threadId()) {
  return ",\"pid\":" + std::to_string(t.pid) + ",\"tid\":" + std::to_string(tid) +
         ",\"args\":" + args.json() + "}\n";
}

std::mutex lanesMu;
std::vector<bool> lanesBusy;

}  // namespace

std::string quoted(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

void Args::key(std::string_view k) {
  if (!body_.empty()) body_ += ',';
  body_ += quoted(k);
  body_ += ':';
}

// Arguments are built by the caller before the recording call checks enabled(): without an open
// timeline they are dropped here, so a disabled timeline formats nothing.
Args& Args::add(std::string_view k, std::string_view value) {
  if (!enabled()) return *this;
  key(k);
  body_ += quoted(value);
  return *this;
}

Args& Args::add(std::string_view k, int64_t value) {
  if (!enabled()) return *this;
  key(k);
  body_ += std::to_string(value);
  return *this;
}

Args& Args::add(std::string_view k, double value) {
  if (!enabled()) return *this;
  key(k);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", value);
  body_ += buf;
  return *this;
}

bool open(const std::string& dir, const std::string& trackName, const std::string& fileStem) {
  Track& t = track();
  std::lock_guard<std::mutex> lock(t.openMu);
  if (t.opened || dir.empty()) return t.on.load();
  t.opened = true;
  t.pid = ::getpid();
  if (const char* mb = std::getenv("DDPRUN_TIMELINE_MAX_MB")) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(mb, &end, 10);
    if (end != mb && *end == '\0' && v > 0) t.maxBytes = v << 20;
  }
  const std::string path = dir + "/" + fileStem + "-" + std::to_string(t.pid) + ".jsonl";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC | O_NOFOLLOW,
                        0644);
  if (fd < 0) {
    DDPRUN_LOG(WARN, "timeline") << "cannot create " << path << ": " << std::strerror(errno)
                                 << "; this process records no timeline";
    return false;
  }
  t.fd = fd;
  const std::string header = "{\"track\":" + quoted(trackName) + ",\"pid\":" +
                             std::to_string(t.pid) + ",\"start_us\":" + std::to_string(nowUs()) +
                             "}\n";
  t.bytes = header.size();
  (void)!::write(fd, header.data(), header.size());
  t.on.store(true, std::memory_order_release);
  return true;
}

bool openFromEnvironment(const std::string& trackName, const std::string& fileStem) {
  const char* dir = std::getenv(kTimelineDirEnv);
  if (dir == nullptr || *dir == '\0') return false;
  return open(dir, trackName, fileStem);
}

void close() {
  Track& t = track();
  std::lock_guard<std::mutex> lock(t.openMu);
  t.on.store(false);
  if (t.fd >= 0) ::close(t.fd);
  t.fd = -1;
  t.opened = false;
  t.capped = false;
}

bool enabled() { return track().on.load(std::memory_order_acquire); }

namespace {
int64_t testSkewUs() {
  static const int64_t skew = [] {
    const char* v = std::getenv(kTestClockSkewEnv);
    if (v == nullptr || *v == '\0') return int64_t{0};
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    return end != v && *end == '\0' ? static_cast<int64_t>(n) : int64_t{0};
  }();
  return skew;
}
}  // namespace

int64_t minorFaults() {
  rusage u{};
  return ::getrusage(RUSAGE_SELF, &u) == 0 ? static_cast<int64_t>(u.ru_minflt) : 0;
}

int64_t nowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
             .count() +
         testSkewUs();
}

void recordClockOffset(int64_t offsetUs, int64_t boundUs, int64_t rttUs, int samples,
                       std::string_view reference) {
  if (!enabled()) return;
  const std::string line = "{\"clock\":{\"offset_us\":" + std::to_string(offsetUs) +
                           ",\"bound_us\":" + std::to_string(boundUs) + ",\"rtt_us\":" +
                           std::to_string(rttUs) + ",\"samples\":" + std::to_string(samples) +
                           ",\"reference\":" + quoted(reference) + "},\"ts\":" +
                           std::to_string(nowUs()) + "}\n";
  writeLine(track(), line);
}

void span(std::string_view name, std::string_view category, int64_t startUs, int64_t durUs,
          const Args& args) {
  if (!enabled()) return;
  Track& t = track();
  std::string line = event("X", name, category, startUs);
  line += ",\"dur\":" + std::to_string(durUs < 0 ? 0 : durUs);
  line += tail(t, args);
  writeLine(t, line);
}

void instant(std::string_view name, std::string_view category, const Args& args) {
  if (!enabled()) return;
  Track& t = track();
  std::string line = event("i", name, category, nowUs());
  line += ",\"s\":\"t\"";
  line += tail(t, args);
  writeLine(t, line);
}

int acquireLane() {
  std::lock_guard<std::mutex> lock(lanesMu);
  for (size_t k = 0; k < lanesBusy.size(); ++k) {
    if (!lanesBusy[k]) {
      lanesBusy[k] = true;
      return static_cast<int>(k);
    }
  }
  lanesBusy.push_back(true);
  return static_cast<int>(lanesBusy.size() - 1);
}

void releaseLane(int lane) {
  std::lock_guard<std::mutex> lock(lanesMu);
  if (lane >= 0 && static_cast<size_t>(lane) < lanesBusy.size()) lanesBusy[lane] = false;
}

void spanOnLane(int lane, std::string_view name, std::string_view category, int64_t startUs,
                int64_t durUs, const Args& args) {
  if (!enabled()) return;
  Track& t = track();
  std::string line = event("X", name, category, startUs);
  line += ",\"dur\":" + std::to_string(durUs < 0 ? 0 : durUs);
  line += tail(t, args, kFirstLane + lane);
  writeLine(t, line);
}

Scope::Scope(std::string_view name, std::string_view category)
    : name_(name), category_(category), start_(0), on_(enabled()) {
  if (on_) start_ = nowUs();
}

Scope::~Scope() {
  if (!on_) return;
  if (faults_) faults_->addTo(args_);
  span(name_, category_, start_, nowUs() - start_, args_);
}

Args& FaultCount::addTo(Args& args) const {
  if (start_ >= 0) args.add("minor_faults", minorFaults() - start_);
  return args;
}

}  // namespace ddprun::timeline
