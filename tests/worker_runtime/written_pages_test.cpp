// The pages a fork wrote (worker_runtime/written_pages.h), in real forked processes: a child
// finds exactly the pages it wrote since its fork among those it shares with its parent, and a
// fork of that child, touching them, makes them its own without changing a byte.
#include "tests/support/catch_torch.h"  // the runtime tests share one binary with LibTorch

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "worker_runtime/written_pages.h"

using ddprun::runtime::exclusivePages;
using ddprun::runtime::touchPages;
using ddprun::runtime::WrittenPages;

namespace {

constexpr size_t kPages = 64;

bool holds(const WrittenPages& w, uintptr_t page) {
  for (const auto& r : w.runs) {
    if (page >= r.start && page < r.start + r.bytes) return true;
  }
  return false;
}

// Runs `body` in a forked child and returns its exit code (the child's checks: 0 = all held).
template <class F>
int inChild(F body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
}

}  // namespace

TEST_CASE("written pages: a fork finds the pages it wrote since the fork, not those it only "
          "shares, and its own fork's touch makes them its own with their bytes unchanged",
          "[runtime][spare][template]") {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  auto* mem = static_cast<unsigned char*>(::mmap(nullptr, kPages * page, PROT_READ | PROT_WRITE,
                                                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  REQUIRE(mem != MAP_FAILED);
  for (size_t i = 0; i < kPages; ++i) std::memset(mem + i * page, static_cast<int>(i), page);
  const auto base = reinterpret_cast<uintptr_t>(mem);
  // The parent's own view, before any fork: every page of the mapping is its alone.
  const WrittenPages mine = exclusivePages();
  for (size_t i = 0; i < kPages; ++i) CHECK(holds(mine, base + i * page));
  CHECK(mine.pages <= mine.present);

  const int code = inChild([&]() -> int {
    // Pages 3, 4, 5 and 40 written, 20 only read: the child's set has the first four.
    for (const size_t i : {3, 4, 5, 40}) mem[i * page + 7] = 0xAB;
    volatile unsigned char sink = mem[20 * page];
    (void)sink;
    const WrittenPages written = exclusivePages();
    for (const size_t i : {3, 4, 5, 40}) {
      if (!holds(written, base + i * page)) return 1;
    }
    for (const size_t i : {0, 2, 6, 20, 39, 41, 63}) {
      if (holds(written, base + i * page)) return 2;
    }
    if (written.pages * 2 > written.present) return 3;  // most of its pages are still shared
    // A fork of the child: the touch copies those pages, leaves every byte as it was.
    return inChild([&]() -> int {
      if (touchPages(written) != written.pages) return 4;
      const WrittenPages now = exclusivePages();
      for (const size_t i : {3, 4, 5, 40}) {
        if (!holds(now, base + i * page)) return 5;
      }
      if (holds(now, base + 20 * page)) return 6;
      for (size_t i = 0; i < kPages; ++i) {
        const bool wrote = i == 3 || i == 4 || i == 5 || i == 40;
        if (mem[i * page + 7] != (wrote ? 0xAB : static_cast<unsigned char>(i))) return 7;
        if (mem[i * page] != static_cast<unsigned char>(i)) return 8;
      }
      return 0;
    });
  });
  CHECK(code == 0);
  ::munmap(mem, kPages * page);
}

TEST_CASE("written pages: a run no longer mapped is skipped, not touched",
          "[runtime][spare][template]") {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* gone = ::mmap(nullptr, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
  REQUIRE(gone != MAP_FAILED);
  REQUIRE(::munmap(gone, 4 * page) == 0);
  WrittenPages w;
  w.runs.push_back({.start = reinterpret_cast<uintptr_t>(gone), .bytes = 4 * page});
  w.pages = 4;
  CHECK(inChild([&] { return static_cast<int>(touchPages(w)); }) == 0);  // no fault, none touched
}
