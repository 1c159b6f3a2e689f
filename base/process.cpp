#include "base/process.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

namespace ddprun {

bool processDead(int32_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  // Plain open/read, not a stream: a process that exits between the two makes read() fail with
  // ESRCH, which libstdc++'s filebuf turns into an exception ("basic_filebuf::underflow error
  // reading the file: No such process"); here it is what it means, a dead process.
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT || errno == ESRCH;
  char text[1024];
  ssize_t n;
  do {
    n = ::read(fd, text, sizeof text - 1);
  } while (n < 0 && errno == EINTR);
  const int readErrno = errno;
  ::close(fd);
  if (n < 0) return readErrno == ESRCH;
  text[n] = '\0';
  // The state is the first field after the command name, which may itself hold ')'.
  const char* paren = std::strrchr(text, ')');
  if (paren == nullptr || paren + 2 >= text + n) return false;
  const char state = paren[2];
  return state == 'Z' || state == 'X';
}

namespace {

// The text of /proc/<pid>/<file> (up to 4 KB), or nullopt when it cannot be read (gone).
std::optional<std::string> readProcFile(int32_t pid, const char* file) {
  const std::string path = "/proc/" + std::to_string(pid) + "/" + file;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char text[4096];
  size_t used = 0;
  bool failed = false;
  for (;;) {
    const ssize_t n = ::read(fd, text + used, sizeof text - 1 - used);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) failed = true;
    if (n <= 0) break;
    used += static_cast<size_t>(n);
    if (used == sizeof text - 1) break;
  }
  ::close(fd);
  if (failed) return std::nullopt;
  return std::string(text, used);
}

// What processExiting and processDying read of /proc/<pid>/stat.
struct StatFields {
  char state = '?';
  bool exiting = false;  // PF_EXITING (0x4) in the flags (field 9): do_exit() has begun
  int exitCode = 0;      // the last field (exit_code, Linux >= 3.5): a wait status
};

// nullopt when the file cannot be read (gone) or does not parse.
std::optional<StatFields> readStat(int32_t pid) {
  const auto stat = readProcFile(pid, "stat");
  if (!stat) return std::nullopt;
  // The fields after the command name, which may itself hold ')' and spaces.
  const size_t paren = stat->rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat->size()) return std::nullopt;
  StatFields f;
  f.state = (*stat)[paren + 2];
  // state is field 3; flags field 9: six more fields on.
  const char* p = stat->c_str() + paren + 2;
  for (int i = 0; i < 6 && p != nullptr; ++i) {
    p = std::strchr(p, ' ');
    if (p != nullptr) ++p;
  }
  if (p != nullptr) f.exiting = (std::strtoul(p, nullptr, 10) & 0x4u) != 0;
  const size_t last = stat->find_last_not_of(" \n");
  const size_t from = stat->find_last_of(' ', last);
  if (last != std::string::npos && from != std::string::npos && from > paren) {
    f.exitCode = static_cast<int>(std::strtol(stat->c_str() + from + 1, nullptr, 10));
  }
  return f;
}

// A SIGKILL pending for `pid` (/proc/<pid>/status SigPnd or ShdPnd).
bool sigkillPending(int32_t pid) {
  const auto status = readProcFile(pid, "status");
  if (!status) return false;
  // "SigPnd:\t0000000000000100": a hexadecimal mask, bit (signal - 1).
  for (const char* field : {"\nSigPnd:", "\nShdPnd:"}) {
    const size_t at = status->find(field);
    if (at == std::string::npos) continue;
    const unsigned long long mask =
        std::strtoull(status->c_str() + at + std::strlen(field), nullptr, 16);
    if (mask & (1ULL << (SIGKILL - 1))) return true;
  }
  return false;
}

}  // namespace

bool processExiting(int32_t pid) {
  if (pid <= 0) return false;
  if (processDead(pid)) return true;
  const auto stat = readStat(pid);
  if (!stat) return false;  // unreadable but not ESRCH/ENOENT: as processDead, not known dead
  return stat->exiting || stat->state == 'Z' || stat->state == 'X' || sigkillPending(pid);
}

bool processDying(int32_t pid, int* waitStatus) {
  if (pid <= 0) return false;
  const auto stat = readStat(pid);
  if (!stat) return false;  // reaped already: its own exit report says how it ended
  if (stat->state == 'Z' || stat->exiting) {
    // A zombie, or on its way to one: its wait status is the stat's exit_code.
    if (stat->exitCode == 0) {
      if (stat->state == 'Z') return false;  // exit 0 is no death
    } else {
      if (waitStatus != nullptr) *waitStatus = stat->exitCode;
      return true;
    }
  }
  if (sigkillPending(pid)) {
    if (waitStatus != nullptr) *waitStatus = SIGKILL;  // as waitpid reports a SIGKILL death
    return true;
  }
  return false;
}

namespace {
// CAP_SYS_NICE (23) in this process's effective set, from /proc/self/status.
bool hasSysNice() {
  const int fd = ::open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  ::close(fd);
  const auto at = text.find("\nCapEff:");
  if (at == std::string::npos) return false;
  const unsigned long long caps = std::strtoull(text.c_str() + at + 8, nullptr, 16);
  return (caps >> 23) & 1ULL;
}
}  // namespace

bool canLeaveIdlePriority(std::string& why) {
  if (hasSysNice()) return true;
  rlimit rl{};
  if (::getrlimit(RLIMIT_NICE, &rl) == 0 && (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= 20)) {
    return true;
  }
  why = "neither CAP_SYS_NICE nor an RLIMIT_NICE of 20 (ulimit -e " + std::to_string(rl.rlim_cur) +
        ")";
  return false;
}

}  // namespace ddprun
