// The spare template's side (worker_runtime/spare/spare_template.h), in a real forked process on a real
// socket pair, without ddprun: it runs the program's warm-up once before it says Ready, a
// warm-up that leaves a thread running makes it exit 3 with one line, never saying Ready (a fork
// of it would lack that thread), and a malformed request forks nothing. The agent's side and whole jobs: tests/trainers.
#include "tests/support/catch_torch.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "base/fd_passing.h"
#include "rendezvous/spare_fork.h"
#include "worker_runtime/spare/spare_template.h"

using Catch::Matchers::Contains;
namespace wire = ddprun::rendezvous::spare_fork;

namespace {

constexpr int kWaitMs = 30'000;

// A template process: serveSpareForks() on one end of a socket pair, its stderr into a pipe, and
// a second pipe `warmUp` may write to. Killed and reaped on destruction if still running.
struct TemplateProcess {
  pid_t pid = -1;
  int agent = -1;   // our end of the socket
  int stderrRead = -1;
  int markRead = -1;

  explicit TemplateProcess(const std::function<bool(int markFd)>& warmUp) {
    int sv[2], err[2], mark[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    REQUIRE(::pipe2(err, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(mark, O_CLOEXEC) == 0);
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::dup2(err[1], 2);
      ::close(sv[0]);
      const int markFd = mark[1];
      ddprun::runtime::serveSpareForks(sv[1], [&] { return warmUp(markFd); });
      ::_exit(99);  // only a forked spare returns, and this test asks for none
    }
    ::close(sv[1]);
    ::close(err[1]);
    ::close(mark[1]);
    agent = sv[0];
    stderrRead = err[0];
    markRead = mark[0];
  }
  ~TemplateProcess() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    for (int fd : {agent, stderrRead, markRead}) {
      if (fd >= 0) ::close(fd);
    }
  }
  // The next reply, or kind 0 on EOF or after kWaitMs.
  wire::Reply nextReply() const {
    wire::Reply r{};
    pollfd p{agent, POLLIN, 0};
    if (::poll(&p, 1, kWaitMs) != 1) return r;
    if (::recv(agent, &r, sizeof r, MSG_WAITALL) != static_cast<ssize_t>(sizeof r)) return {};
    return r;
  }
  // Its exit code once it has exited (within kWaitMs), else -1.
  int exitCode() {
    for (int i = 0; i < kWaitMs / 10; ++i) {
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }
  // Everything it wrote to stderr (call once it has exited).
  std::string errors() const {
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(stderrRead, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
    return out;
  }
};

}  // namespace

TEST_CASE("spare template process: the warm-up runs once before Ready, and the template exits 0 "
          "when the agent closes the socket", "[spare][template]") {
  TemplateProcess t([](int markFd) {
    const char warmed = 'w';
    return ::write(markFd, &warmed, 1) == 1;
  });
  const wire::Reply ready = t.nextReply();
  CHECK(ready.kind == wire::Reply::Ready);
  CHECK(ready.value == t.pid);
  // The warm-up's mark was written before Ready was sent: it is there now, once.
  const int flags = ::fcntl(t.markRead, F_GETFL);
  REQUIRE(::fcntl(t.markRead, F_SETFL, flags | O_NONBLOCK) == 0);
  char marks[4];
  CHECK(::read(t.markRead, marks, sizeof marks) == 1);
  ::shutdown(t.agent, SHUT_RDWR);
  CHECK(t.exitCode() == 0);
}

TEST_CASE("spare template process: a warm-up that leaves a thread running makes it exit 3 with "
          "one line naming the threads, without saying Ready", "[spare][template]") {
  TemplateProcess t([](int) {
    std::thread([] { ::pause(); }).detach();  // still running when the warm-up returns
    return true;
  });
  CHECK(t.nextReply().kind == 0);  // EOF: no Ready
  CHECK(t.exitCode() == 3);
  const std::string err = t.errors();
  CHECK_THAT(err, Contains("the program's spare warm-up left 2 threads, so it cannot fork spares"));
  CHECK_THAT(err, Contains("the launcher starts its spares as processes"));
}

// What the launcher sends is checked before anything is forked: a request without its four
// descriptors, with another magic, or announcing more environment than the bound, ends the
// template with one line naming what came, and no reply (the launcher then exec's its spares).
TEST_CASE("spare template process: a malformed request (descriptors, magic, environment size) "
          "forks nothing and ends the template with one line naming it", "[spare][template]") {
  struct Case {
    int fds;
    uint32_t magic;
    uint32_t envBytes;
  };
  for (const Case c : {Case{2, wire::kRequestMagic, 0}, Case{4, 0x41414141, 0},
                       Case{4, wire::kRequestMagic, wire::kMaxEnvBytes + 1}}) {
    INFO(c.fds << " descriptors, magic " << c.magic << ", " << c.envBytes << " bytes");
    TemplateProcess t([](int) { return true; });
    REQUIRE(t.nextReply().kind == wire::Reply::Ready);
    int pipes[4][2];
    int ends[4];
    for (int i = 0; i < 4; ++i) {
      REQUIRE(::pipe2(pipes[i], O_CLOEXEC) == 0);
      ends[i] = pipes[i][1];
    }
    wire::Request head;
    head.magic = c.magic;
    head.spareId = 0;
    head.envBytes = c.envBytes;
    REQUIRE(ddprun::sendWithFds(t.agent, &head, sizeof head,
                                std::span<const int>(ends, static_cast<size_t>(c.fds))) ==
            static_cast<ssize_t>(sizeof head));
    CHECK(t.nextReply().kind == 0);  // EOF: no Forked
    CHECK(t.exitCode() == 0);
    CHECK_THAT(t.errors(), Contains("spare template: a request it cannot read (" +
                                    std::to_string(c.fds) + " descriptors, magic " +
                                    std::to_string(c.magic) + ", " + std::to_string(c.envBytes) +
                                    " bytes of environment); exiting"));
    // Nothing forked holds the descriptors it was sent: each pipe's read end sees EOF.
    for (int i = 0; i < 4; ++i) {
      ::close(pipes[i][1]);
      pollfd p{pipes[i][0], POLLIN, 0};
      char b;
      CHECK((::poll(&p, 1, kWaitMs) == 1 && ::read(pipes[i][0], &b, 1) == 0));
      ::close(pipes[i][0]);
    }
  }
}
