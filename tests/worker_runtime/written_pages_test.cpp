// The pages a fork wrote (worker_runtime/spare/written_pages.h), in real forked processes: a child
// finds exactly the pages it wrote since its fork among those it shares with its parent, and a
// fork of that child, touching them, makes them its own without changing a byte -- page by page,
// or as whole huge pages where enough of them share a 2 MB-aligned chunk of an anonymous mapping.
#include "tests/support/catch_torch.h"  // the runtime tests share one binary with LibTorch

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tests/support/skip.h"
#include "worker_runtime/spare/written_pages.h"

using ddprun::runtime::exclusivePages;
using ddprun::runtime::kMinPagesToCollapse;
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
      if (touchPages(written).pages != written.pages) return 4;
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
  CHECK(inChild([&] { return static_cast<int>(touchPages(w).pages); }) == 0);  // no fault, none
}

TEST_CASE("written pages: a chunk of an anonymous mapping holding enough of them is copied as one "
          "huge page, a sparse one page by page, and no byte changes",
          "[runtime][spare][template]") {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const WrittenPages probe = exclusivePages();
  if (probe.chunkBytes == 0) {
    ddprun::testing::skipTest("this kernel has no transparent huge pages (hpage_pmd_size)");
    return;
  }
  const size_t chunk = probe.chunkBytes, perChunk = chunk / page;
  // Three whole chunks, from one page past an aligned address: the first and the last lie
  // only partly inside, so the mapping holds exactly the two in between.
  const size_t bytes = 4 * chunk;
  auto* raw = static_cast<unsigned char*>(::mmap(nullptr, bytes + chunk, PROT_READ | PROT_WRITE,
                                                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  REQUIRE(raw != MAP_FAILED);
  const uintptr_t aligned = (reinterpret_cast<uintptr_t>(raw) + chunk - 1) & ~(chunk - 1);
  auto* mem = reinterpret_cast<unsigned char*>(aligned + page);
  const size_t len = 3 * chunk;  // [aligned + page, aligned + 3 chunks + page)
  // The rest of the reservation inaccessible: the writable mapping is [mem, mem + len) alone
  // (no neighbour mapped later merges with it).
  REQUIRE(::mprotect(raw, static_cast<size_t>(mem - raw), PROT_NONE) == 0);
  REQUIRE(::mprotect(mem + len, static_cast<size_t>(raw + bytes + chunk - (mem + len)),
                     PROT_NONE) == 0);
  for (size_t i = 0; i < len / page; ++i) {
    std::memset(mem + i * page, static_cast<int>(i % 251), page);
  }
  // Can this kernel collapse at all (Linux 6.1, huge pages not off)? Asked of a scratch mapping.
  bool canCollapse = false;
  if (void* s = ::mmap(nullptr, 2 * chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0); s != MAP_FAILED) {
    const uintptr_t a = (reinterpret_cast<uintptr_t>(s) + chunk - 1) & ~(chunk - 1);
    std::memset(reinterpret_cast<void*>(a), 1, page);
    canCollapse = ::madvise(reinterpret_cast<void*>(a), chunk, 25 /* MADV_COLLAPSE */) == 0;
    ::munmap(s, 2 * chunk);
  }
  const uintptr_t dense = aligned + chunk, sparse = aligned + 2 * chunk;
  auto at = [&](uintptr_t a) { return static_cast<size_t>(a - reinterpret_cast<uintptr_t>(mem)); };
  const int code = inChild([&]() -> int {
    // The child writes 100 pages of the first whole chunk, 10 of the second, and the first
    // page of the mapping (in no whole chunk).
    for (size_t i = 0; i < 100; ++i) mem[at(dense) + i * 2 * page + 5] = 0xCD;
    for (size_t i = 0; i < 10; ++i) mem[at(sparse) + i * page + 5] = 0xCD;
    mem[5] = 0xCD;
    const WrittenPages written = exclusivePages();
    size_t inDense = 0, inSparse = 0;
    for (const auto& c : written.chunks) {
      if (c.start == dense) inDense = c.pages;
      if (c.start == sparse) inSparse = c.pages;
      if (c.start == aligned) return 10;  // only partly inside the mapping: no chunk
    }
    if (inDense != 100 || inSparse != 10) return 11;
    return inChild([&]() -> int {
      const auto touched = touchPages(written);
      if (touched.pages != written.pages) return 12;
      const WrittenPages now = exclusivePages();
      if (canCollapse) {
        // The dense chunk is its own whole (all its pages, written or not), the sparse one only
        // the 10 pages written.
        if (touched.huge < 1 || touched.hugePages < 100) return 13;
        for (size_t i = 0; i < perChunk; ++i) {
          if (!holds(now, dense + i * page)) return 14;
        }
        if (holds(now, sparse + 10 * page)) return 15;
      }
      for (size_t i = 0; i < 10; ++i) {
        if (!holds(now, sparse + i * page)) return 16;
      }
      for (size_t i = 0; i < len / page; ++i) {
        const size_t off = i * page;
        const bool wrote = off == 0 || (off >= at(dense) && off < at(dense) + 200 * page &&
                                        (off - at(dense)) % (2 * page) == 0) ||
                           (off >= at(sparse) && off < at(sparse) + 10 * page);
        if (mem[off + 5] != (wrote ? 0xCD : static_cast<unsigned char>(i % 251))) return 17;
        if (mem[off + 6] != static_cast<unsigned char>(i % 251)) return 18;
      }
      return 0;
    });
  });
  CHECK(code == 0);
  // The parent's bytes are its own still.
  for (size_t i = 0; i < len / page; ++i) {
    if (mem[i * page + 5] != static_cast<unsigned char>(i % 251)) FAIL("page " << i << " changed");
  }
  INFO("MADV_COLLAPSE here: " << (canCollapse ? "yes" : "no (the page-by-page copy was tested)"));
  CHECK(kMinPagesToCollapse > 10);  // the sparse chunk above is below it
  ::munmap(raw, bytes + chunk);
}
