// runtime::exitProcess (runtime.h): a real child process ends with the code it was given, its
// buffered output (C stdio and iostreams, without a newline or a flush of its own) reaches the
// pipe, and neither its atexit handlers nor its static destructors run.
#include "tests/support/catch_torch.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "worker_runtime/runtime.h"

namespace {

int pipeFd = -1;  // the child's end, for what must not be written

// A static destructor with a visible effect, as LibTorch's registries have.
struct Witness {
  ~Witness() {
    if (pipeFd >= 0) (void)::write(pipeFd, "|destructor", 11);
  }
};

std::string runChild(int code, int& status) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  std::cout.flush();
  std::fflush(nullptr);  // nothing of the parent's is duplicated into the child's buffers
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    pipeFd = fds[1];
    // A full buffer (a pipe is not a terminal) with no newline, and the iostreams' own.
    std::setvbuf(stdout, nullptr, _IOFBF, 1 << 16);
    std::printf("stdio");
    std::cout << "|cout";
    std::cerr << "|cerr";
    std::atexit([] { (void)::write(pipeFd, "|atexit", 7); });
    static Witness witness;
    ddprun::exitProcess(code);
  }
  ::close(fds[1]);
  std::string out;
  char buf[256];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    REQUIRE(n > 0);
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return out;
}

}  // namespace

TEST_CASE("exitProcess ends with the code, output flushed, no atexit handler nor static "
          "destructor run", "[exit]") {
  for (const int code : {0, 3}) {
    int status = 0;
    const std::string out = runChild(code, status);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == code);
    CHECK(out.find("stdio") != std::string::npos);
    CHECK(out.find("|cout") != std::string::npos);
    CHECK(out.find("|cerr") != std::string::npos);
    CHECK(out.find("|atexit") == std::string::npos);
    CHECK(out.find("|destructor") == std::string::npos);
  }
}
