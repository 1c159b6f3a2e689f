#include "base/process.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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

}  // namespace ddprun
