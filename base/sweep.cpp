#include "base/sweep.h"

#include "base/signal_safe_io.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ddprun {

namespace {

struct ProcEntry {
  pid_t pid, ppid;
  bool live;  // not a zombie
};
constexpr size_t kMaxProcs = 1 << 16;
ProcEntry gProcs[kMaxProcs];  // only ever touched in the guard (its own copy of the page)

bool parseDecimal(const char* s, pid_t& out) {
  if (*s == '\0') return false;
  long v = 0;
  for (; *s != '\0'; ++s) {
    if (*s < '0' || *s > '9' || v > (1L << 30)) return false;
    v = v * 10 + (*s - '0');
  }
  out = static_cast<pid_t>(v);
  return true;
}

// /proc/<pid>/stat is "pid (comm) S ppid ...": comm may hold anything, so parse after the
// last ')'.
bool readStat(pid_t pid, pid_t& ppid, bool& live) {
  char path[48] = "/proc/";
  char digits[16];
  int n = 0;
  for (pid_t v = pid; v > 0 && n < 15; v /= 10) digits[n++] = static_cast<char>('0' + v % 10);
  size_t at = 6;
  while (n > 0) path[at++] = digits[--n];
  for (const char* t = "/stat"; *t != '\0'; ++t) path[at++] = *t;
  path[at] = '\0';
  char buf[512];
  if (readSmallFile(path, buf, sizeof buf) <= 0) return false;
  char* close = nullptr;
  for (char* c = buf; *c != '\0'; ++c) {
    if (*c == ')') close = c;
  }
  if (close == nullptr || close[1] != ' ' || close[2] == '\0' || close[3] != ' ') return false;
  live = close[2] != 'Z' && close[2] != 'X';
  char* p = close + 4;
  char* end = p;
  while (*end >= '0' && *end <= '9') ++end;
  *end = '\0';
  return parseDecimal(p, ppid);
}

}  // namespace

size_t killDescendants() noexcept {
  const pid_t self = ::getpid();
  size_t count = 0;
  const int dir = ::open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return 0;
  alignas(8) char buf[8192];
  while (count < kMaxProcs) {
    const long got = ::syscall(SYS_getdents64, dir, buf, sizeof buf);
    if (got <= 0) break;
    for (long off = 0; off < got && count < kMaxProcs;) {
      // struct linux_dirent64 { u64 d_ino; s64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
      unsigned short reclen;
      std::memcpy(&reclen, buf + off + 16, sizeof reclen);
      const char* name = buf + off + 19;
      off += reclen;
      ProcEntry e{};
      if (!parseDecimal(name, e.pid) || e.pid == self) continue;
      if (readStat(e.pid, e.ppid, e.live)) gProcs[count++] = e;
    }
  }
  ::close(dir);
  // Mark descendants: children of self, then children of marked ones, until nothing changes.
  size_t alive = 0;
  bool changed = true;
  static bool marked[kMaxProcs];
  for (size_t i = 0; i < count; ++i) marked[i] = gProcs[i].ppid == self;
  while (changed) {
    changed = false;
    for (size_t i = 0; i < count; ++i) {
      if (marked[i]) continue;
      for (size_t j = 0; j < count; ++j) {
        if (marked[j] && gProcs[j].pid == gProcs[i].ppid) {
          marked[i] = changed = true;
          break;
        }
      }
    }
  }
  for (size_t i = 0; i < count; ++i) {
    if (!marked[i] || !gProcs[i].live) continue;
    ::kill(gProcs[i].pid, SIGKILL);
    ++alive;
  }
  return alive;
}

void takeGuardSignals(void (*onChild)(int)) noexcept {
  struct sigaction dfl {}, ign {}, chld {};
  dfl.sa_handler = SIG_DFL;
  ign.sa_handler = SIG_IGN;
  chld.sa_handler = onChild;
  for (int s = 1; s < NSIG; ++s) {
    struct sigaction current {};
    if (::sigaction(s, nullptr, &current) == 0 && current.sa_handler != SIG_DFL &&
        current.sa_handler != SIG_IGN) {
      ::sigaction(s, &dfl, nullptr);
    }
  }
  for (int s : kGuardForwardedSignals) ::sigaction(s, &ign, nullptr);
  ::sigaction(SIGCHLD, &chld, nullptr);
}

}  // namespace ddprun
