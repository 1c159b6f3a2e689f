#include "launcher/job_cgroup.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <vector>

#include "base/log.h"
#include "base/signal_safe_io.h"

namespace ddprun::launcher {

namespace {

std::vector<std::string_view> splitLines(std::string_view text) {
  std::vector<std::string_view> out;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    out.push_back(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
  }
  return out;
}

std::vector<std::string_view> splitSpaces(std::string_view line) {
  std::vector<std::string_view> out;
  size_t at = 0;
  while (at < line.size()) {
    const size_t sp = line.find(' ', at);
    const size_t end = sp == std::string_view::npos ? line.size() : sp;
    if (end > at) out.push_back(line.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

// mountinfo escapes space, tab, newline and backslash in paths as \ooo (octal).
std::string unescapeMountPath(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '3' &&
        s[i + 2] >= '0' && s[i + 2] <= '7' && s[i + 3] >= '0' && s[i + 3] <= '7') {
      out += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string readWhole(const char* path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// ---- Async-signal-safe pieces (used by the guard between fork and exit) ----

// dst = a + b, truncated to fit; returns false when it did not fit.
bool joinPath(char* dst, size_t size, const char* a, const char* b) {
  size_t n = 0;
  for (const char* p = a; *p != '\0'; ++p) {
    if (n + 1 >= size) return false;
    dst[n++] = *p;
  }
  for (const char* p = b; *p != '\0'; ++p) {
    if (n + 1 >= size) return false;
    dst[n++] = *p;
  }
  dst[n] = '\0';
  return true;
}

int writeString(const char* path, const char* text) {
  const int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  const size_t len = std::strlen(text);
  ssize_t w;
  do {
    w = ::write(fd, text, len);
  } while (w < 0 && errno == EINTR);
  const int err = w < 0 ? errno : 0;
  ::close(fd);
  return err;
}

// cgroup.events has a line "populated 0" once no process is left in the cgroup or below it.
// Unreadable (gone) counts as empty.
bool cgroupEmpty(const char* eventsPath) {
  char buf[256];
  const ssize_t n = readSmallFile(eventsPath, buf, sizeof buf);
  if (n <= 0) return true;
  static constexpr char kKey[] = "populated ";
  for (ssize_t i = 0; i + static_cast<ssize_t>(sizeof kKey) <= n; ++i) {
    if (std::memcmp(buf + i, kKey, sizeof kKey - 1) == 0 && (i == 0 || buf[i - 1] == '\n')) {
      return buf[i + sizeof kKey - 1] == '0';
    }
  }
  return true;
}

long nowMs() {
  struct timespec t {};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000L + t.tv_nsec / 1000000L;
}

// rmdir of `dir` after its child cgroups (depth first; they are empty by now).
bool removeTree(const char* dir, int depth) {
  if (depth < 16) {
    const int fd = ::open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT;
    alignas(8) char buf[2048];
    long got;
    while ((got = ::syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
      for (long off = 0; off < got;) {
        // struct linux_dirent64 { u64 d_ino; s64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
        unsigned short reclen;
        std::memcpy(&reclen, buf + off + 16, sizeof reclen);
        const unsigned char type = static_cast<unsigned char>(buf[off + 18]);
        const char* name = buf + off + 19;
        off += reclen;
        if (type != DT_DIR || std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0) {
          continue;
        }
        char child[4096];
        if (joinPath(child, sizeof child, dir, "/") &&
            joinPath(child, sizeof child, child, name)) {
          removeTree(child, depth + 1);
        }
      }
    }
    ::close(fd);
  }
  return ::rmdir(dir) == 0 || errno == ENOENT;
}

std::string sanitizedName(const std::string& s) {
  std::string out;
  for (char c : s.substr(0, 40)) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    out += ok ? c : '_';
  }
  return out;
}

}  // namespace

CgroupLookup findOwnCgroup2(std::string_view mountinfo, std::string_view procSelfCgroup) {
  std::string own;
  bool found = false;
  for (auto line : splitLines(procSelfCgroup)) {
    if (line.substr(0, 3) == "0::") {
      own = std::string(line.substr(3));
      found = true;
    }
  }
  if (!found) return {"", "no cgroup v2 entry (0::) in /proc/self/cgroup: cgroup v1 only"};
  if (own.empty() || own[0] != '/' || own.find("/..") != std::string::npos ||
      own.find(" (deleted)") != std::string::npos) {
    return {"", "this process's cgroup '" + own + "' is outside its cgroup namespace"};
  }
  for (auto line : splitLines(mountinfo)) {
    // id parent major:minor root mountpoint options [optional...] - fstype source superoptions
    if (line.find("cgroup2") == std::string_view::npos) continue;  // most lines: not split
    const auto f = splitSpaces(line);
    size_t dash = 6;
    while (dash < f.size() && f[dash] != "-") ++dash;
    if (dash + 1 >= f.size() || f[dash + 1] != "cgroup2") continue;
    const std::string root = unescapeMountPath(f[3]);
    std::string rel;
    if (root == "/") {
      rel = own;
    } else if (own == root || own.rfind(root + "/", 0) == 0) {
      rel = own.substr(root.size());
    } else {
      continue;  // a mount of another part of the hierarchy
    }
    if (rel == "/") rel.clear();
    const std::string dir = unescapeMountPath(f[4]) + rel;
    const std::string options = "," + std::string(f[5]) + ",";
    if (options.find(",ro,") != std::string::npos) {
      return {"", "cgroup2 is mounted read-only at " + unescapeMountPath(f[4])};
    }
    return {dir, ""};
  }
  return {"", "no cgroup2 mount holding this process's cgroup '" + own + "' in /proc/self/mountinfo"};
}

CgroupLookup findOwnCgroup2() {
  return findOwnCgroup2(readWhole("/proc/self/mountinfo"), readWhole("/proc/self/cgroup"));
}

int joinCgroup(const WorkerCgroup& cg) noexcept {
  if (cg.dir.empty()) return 0;
  return writeString(cg.procs.c_str(), "0");
}

void killCgroup(const WorkerCgroup& cg) noexcept {
  if (!cg.dir.empty()) writeString(cg.kill.c_str(), "1");
}

bool killAndRemoveCgroup(const char* dir, int boundMs) noexcept {
  // Empty and without child cgroups (the common case), or gone: one rmdir does it.
  if (::rmdir(dir) == 0 || errno == ENOENT) return true;
  char path[4096];
  if (joinPath(path, sizeof path, dir, "/cgroup.kill") && writeString(path, "1") == 0 &&
      joinPath(path, sizeof path, dir, "/cgroup.events")) {
    const long deadline = nowMs() + boundMs;
    while (!cgroupEmpty(path) && nowMs() < deadline) {
      const struct timespec ms {0, 1000000};
      ::nanosleep(&ms, nullptr);
    }
  }
  return removeTree(dir, 0);
}

std::unique_ptr<JobCgroup> JobCgroup::create(const std::string& runId, bool disabled) {
  constexpr const char* kWithout = "; the guards alone stop what the workers start";
  if (disabled) {
    DDPRUN_LOG(DEBUG, "launcher") << "no job cgroup: DDPRUN_CGROUP=0" << kWithout;
    return nullptr;
  }
  const CgroupLookup own = findOwnCgroup2();
  if (own.dir.empty()) {
    DDPRUN_LOG(DEBUG, "launcher") << "no job cgroup: " << own.whyNot << kWithout;
    return nullptr;
  }
  if (::access((own.dir + "/cgroup.procs").c_str(), W_OK) != 0) {
    DDPRUN_LOG(DEBUG, "launcher") << "no job cgroup: " << own.dir
                                  << "/cgroup.procs is not writable (" << std::strerror(errno)
                                  << ")" << kWithout;
    return nullptr;
  }
  const std::string dir =
      own.dir + "/ddprun-" + sanitizedName(runId) + "-" + std::to_string(::getpid());
  if (::mkdir(dir.c_str(), 0755) != 0) {
    DDPRUN_LOG(DEBUG, "launcher") << "no job cgroup: cannot create " << dir << ": "
                                  << std::strerror(errno) << kWithout;
    return nullptr;
  }
  if (::access((dir + "/cgroup.kill").c_str(), W_OK) != 0) {
    ::rmdir(dir.c_str());
    DDPRUN_LOG(DEBUG, "launcher") << "no job cgroup: " << own.dir
                                  << " has no cgroup.kill (Linux < 5.14)" << kWithout;
    return nullptr;
  }
  DDPRUN_LOG(DEBUG, "launcher") << "job cgroup " << dir;
  std::unique_ptr<JobCgroup> job(new JobCgroup(dir));
  if (!job->makeWorkersCgroup()) return nullptr;  // the destructor removes the job's
  return job;
}

JobCgroup::~JobCgroup() {
  // The common end: the workers exited and left nothing, so their cgroup is empty. Removed
  // first, it lets the job's go with one rmdir (no cgroup.kill, no listing of either).
  if (!worker_.dir.empty()) ::rmdir(worker_.dir.c_str());
  if (!killAndRemoveCgroup(dir_.c_str(), 2000)) {
    DDPRUN_LOG(WARN, "launcher") << "could not remove the job's cgroup " << dir_ << ": "
                                 << std::strerror(errno);
  }
}

bool JobCgroup::makeWorkersCgroup() {
  const std::string dir = dir_ + "/workers-" + std::to_string(generation_);
  if (::mkdir(dir.c_str(), 0755) != 0) {
    DDPRUN_LOG(WARN, "launcher") << "cannot create the workers' cgroup " << dir << ": "
                                 << std::strerror(errno)
                                 << "; the guards alone stop what the workers start";
    worker_ = {};
    return false;
  }
  worker_ = WorkerCgroup{.dir = dir,
                         .jobDir = dir_,
                         .procs = dir + "/cgroup.procs",
                         .kill = dir_ + "/cgroup.kill"};
  return true;
}

void JobCgroup::sweep() {
  if (worker_.dir.empty()) return;
  const std::string events = worker_.dir + "/cgroup.events";
  if (cgroupEmpty(events.c_str())) return;
  DDPRUN_LOG(DEBUG, "launcher") << "killing what the stopped group left in " << worker_.dir;
  writeString((worker_.dir + "/cgroup.kill").c_str(), "1");
  const long deadline = nowMs() + kSweepBoundMs;
  while (!cgroupEmpty(events.c_str()) && nowMs() < deadline) {
    const struct timespec ms {0, 1000000};
    ::nanosleep(&ms, nullptr);
  }
  if (!cgroupEmpty(events.c_str())) {
    DDPRUN_LOG(WARN, "launcher") << "processes the stopped workers started are still in "
                                 << worker_.dir << " " << kSweepBoundMs / 1000.0
                                 << " s after cgroup.kill; the next group starts anyway";
  }
  ::rmdir(worker_.dir.c_str());  // a killed cgroup is not reused (see the top of job_cgroup.h)
  ++generation_;
  makeWorkersCgroup();
}

}  // namespace ddprun::launcher
