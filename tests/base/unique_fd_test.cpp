// UniqueFd closes what it owns exactly once: checked against the kernel's descriptor table
// (fcntl(F_GETFD) fails with EBADF on a closed descriptor), and a close twice is caught by
// letting the kernel hand the freed number to a new descriptor that must survive.
#include "base/unique_fd.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <utility>

namespace {

using ddprun::UniqueFd;

bool isOpen(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

int openNull() {
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  return fd;
}

// A new descriptor that gets number `fd`, free before the call (the kernel gives the lowest
// free number; dup2 makes sure of it). The test closes it itself.
int reopenAs(int fd) {
  const int fresh = openNull();
  if (fresh != fd) {
    REQUIRE(::dup2(fresh, fd) == fd);
    ::close(fresh);
  }
  REQUIRE(isOpen(fd));
  return fd;
}

}  // namespace

TEST_CASE("UniqueFd closes its descriptor when destroyed", "[unique_fd]") {
  const int raw = openNull();
  {
    UniqueFd fd(raw);
    CHECK(fd);
    CHECK(fd.get() == raw);
    CHECK(isOpen(raw));
  }
  CHECK_FALSE(isOpen(raw));
  CHECK(errno == EBADF);
}

TEST_CASE("UniqueFd moved from owns nothing and closes nothing", "[unique_fd]") {
  const int raw = openNull();
  UniqueFd outer;
  {
    UniqueFd inner(raw);
    outer = std::move(inner);
    CHECK_FALSE(inner);  // NOLINT(bugprone-use-after-move): the moved-from state is the point
    CHECK(inner.get() == -1);
  }
  CHECK(isOpen(raw));  // the moved-from owner's destruction left it open
  UniqueFd constructed(std::move(outer));
  CHECK(constructed.get() == raw);
  CHECK(isOpen(raw));
  constructed.reset();
  CHECK_FALSE(isOpen(raw));
}

TEST_CASE("UniqueFd move-assignment closes what the target owned", "[unique_fd]") {
  const int first = openNull();
  const int second = openNull();
  UniqueFd a(first);
  UniqueFd b(second);
  a = std::move(b);
  CHECK_FALSE(isOpen(first));
  CHECK(isOpen(second));
  CHECK(a.get() == second);
}

TEST_CASE("UniqueFd release hands the descriptor over open", "[unique_fd]") {
  const int raw = openNull();
  int released = -1;
  {
    UniqueFd fd(raw);
    released = fd.release();
    CHECK_FALSE(fd);
  }
  CHECK(released == raw);
  CHECK(isOpen(raw));
  ::close(raw);
}

TEST_CASE("UniqueFd reset closes the old descriptor and keeps errno", "[unique_fd]") {
  const int first = openNull();
  const int second = openNull();
  UniqueFd fd(first);
  errno = ETIMEDOUT;  // the failure a caller is about to report
  fd.reset(second);
  CHECK(errno == ETIMEDOUT);
  CHECK_FALSE(isOpen(first));
  CHECK(isOpen(second));
  CHECK(fd.get() == second);
  fd.reset();
  CHECK_FALSE(isOpen(second));
  CHECK_FALSE(fd);
  // Even when close itself fails (here EBADF: the descriptor was closed behind its back).
  const int stale = openNull();
  ::close(stale);
  UniqueFd gone(stale);
  errno = ETIMEDOUT;
  gone.reset();
  CHECK(errno == ETIMEDOUT);
}

TEST_CASE("UniqueFd closes once: a descriptor reusing the number survives", "[unique_fd]") {
  SECTION("after close()") {
    UniqueFd fd(openNull());
    const int raw = fd.get();
    CHECK(fd.close() == 0);
    CHECK_FALSE(fd);
    CHECK_FALSE(isOpen(raw));
    reopenAs(raw);
    CHECK(fd.close() == 0);  // owns nothing: closes nothing
    fd.reset();
    CHECK(isOpen(raw));
    ::close(raw);
  }
  SECTION("after reset()") {
    int raw = -1;
    {
      UniqueFd fd(openNull());
      raw = fd.get();
      fd.reset();
      reopenAs(raw);
    }  // destroyed: must not close the new descriptor
    CHECK(isOpen(raw));
    ::close(raw);
  }
  SECTION("close() reports close's failure and still gives the number up") {
    const int raw = openNull();
    ::close(raw);  // behind UniqueFd's back: its close() now fails with EBADF
    UniqueFd fd(raw);
    errno = 0;
    CHECK(fd.close() == -1);
    CHECK(errno == EBADF);
    CHECK_FALSE(fd);
    reopenAs(raw);
    fd.reset();
    CHECK(isOpen(raw));
    ::close(raw);
  }
}
