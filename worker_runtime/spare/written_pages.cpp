#include "worker_runtime/spare/written_pages.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/unique_fd.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; glibc 2.36's headers do not name it
#endif
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1; nor this one
#endif

namespace ddprun::runtime {

namespace {

constexpr uint64_t kPresent = uint64_t{1} << 63;
constexpr uint64_t kExclusive = uint64_t{1} << 56;

std::string readAll(const char* path) {
  std::string text;
  const UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
  if (!fd) return text;
  char buf[16384];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

// The kernel's huge page for anonymous memory, or 0 where it has none (no transparent huge
// pages, or an unreadable sysfs).
size_t hugePageBytes() {
  const std::string text = readAll("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
  const unsigned long long bytes = std::strtoull(text.c_str(), nullptr, 10);
  return bytes > 0 && (bytes & (bytes - 1)) == 0 ? static_cast<size_t>(bytes) : 0;
}

// One mapping's exclusive page, added to the runs and, when it lies in [firstChunk, endChunks)
// (the aligned chunks of an anonymous mapping; an empty range otherwise), to its chunk's count.
void addPage(WrittenPages& out, uintptr_t page, size_t pageSize, uintptr_t firstChunk,
             uintptr_t endChunks) {
  ++out.pages;
  if (!out.runs.empty() && out.runs.back().start + out.runs.back().bytes == page) {
    out.runs.back().bytes += pageSize;
  } else {
    out.runs.push_back({.start = page, .bytes = pageSize});
  }
  if (page < firstChunk || page >= endChunks) return;
  const uintptr_t chunk = page & ~(static_cast<uintptr_t>(out.chunkBytes) - 1);
  if (out.chunks.empty() || out.chunks.back().start != chunk) {
    out.chunks.push_back({.start = chunk, .pages = 0});
  }
  ++out.chunks.back().pages;
}

// MADV_POPULATE_WRITE over [start, start + bytes), then a read per page; the pages it touched.
size_t touchRange(uintptr_t start, size_t bytes, size_t pageSize) {
  // The copies in one call (a fault per page costs more); a range no longer mapped writable
  // (ENOMEM, EFAULT) or a kernel that knows no such advice (EINVAL) is skipped.
  if (bytes == 0 || ::madvise(reinterpret_cast<void*>(start), bytes, MADV_POPULATE_WRITE) != 0) {
    return 0;
  }
  // The madvise filled the kernel's page tables; on a VM with shadow page tables the first
  // access still traps once per page to fill the hypervisor's. A read does that.
  for (size_t off = 0; off < bytes; off += pageSize) {
    (void)*reinterpret_cast<const volatile char*>(start + off);
  }
  return bytes / pageSize;
}

}  // namespace

WrittenPages exclusivePages() {
  WrittenPages out;
  const size_t pageSize = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  out.chunkBytes = hugePageBytes();
  const std::string maps = readAll("/proc/self/maps");
  const UniqueFd pagemap(::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC));
  if (maps.empty() || !pagemap) return out;
  std::vector<uint64_t> entries(8192);
  for (size_t at = 0; at < maps.size(); at = std::min(maps.find('\n', at), maps.size()) + 1) {
    unsigned long start = 0, end = 0, inode = 0;
    char perms[5] = {};
    int pathAt = 0;
    // "start-end perms offset dev inode [path]": private writable mappings only (rw-p); a
    // shared one is written in place, without a copy.
    if (std::sscanf(maps.c_str() + at, "%lx-%lx %4s %*s %*s %lu%n", &start, &end, perms, &inode,
                    &pathAt) != 4) {
      continue;
    }
    if (std::strcmp(perms, "rw-p") != 0 || end <= start) continue;
    // Anonymous (no file, no path, or the brk heap): where a huge page can stand. Its chunks
    // are the aligned ranges wholly inside it.
    size_t p = at + static_cast<size_t>(pathAt);
    while (p < maps.size() && maps[p] == ' ') ++p;
    const bool anonymous =
        inode == 0 && (p >= maps.size() || maps[p] == '\n' || maps.compare(p, 7, "[heap]\n") == 0);
    uintptr_t firstChunk = 0, endChunks = 0;
    if (anonymous && out.chunkBytes > 0) {
      firstChunk = (start + out.chunkBytes - 1) & ~(out.chunkBytes - 1);
      endChunks = end & ~(out.chunkBytes - 1);
    }
    for (uintptr_t page = start; page < end;) {
      const size_t want = std::min(entries.size(), (end - page) / pageSize);
      const ssize_t got = ::pread(pagemap.get(), entries.data(), want * sizeof(uint64_t),
                                  static_cast<off_t>(page / pageSize * sizeof(uint64_t)));
      if (got <= 0) break;
      const size_t n = static_cast<size_t>(got) / sizeof(uint64_t);
      for (size_t i = 0; i < n; ++i) {
        if (!(entries[i] & kPresent)) continue;
        ++out.present;
        if (entries[i] & kExclusive) {
          addPage(out, page + i * pageSize, pageSize, firstChunk, endChunks);
        }
      }
      page += n * pageSize;
    }
  }
  return out;
}

Touched touchPages(const WrittenPages& pages) {
  const size_t pageSize = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  Touched done;
  // First the chunks worth a huge page: the kernel copies each whole (MADV_COLLAPSE), adjacent
  // ones in one call (each call first drains every CPU's page lists, which cost 4 ms here when
  // a CPU was idle). A call that fails (an older kernel, huge pages off, no huge page free:
  // EINVAL, EAGAIN, ENOMEM) is asked again chunk by chunk, and a chunk that still fails is left
  // to the page-by-page copy below (one already collapsed succeeds again at once).
  std::vector<uintptr_t> collapsed;
  auto collapse = [&](uintptr_t start, size_t bytes) {
    return ::madvise(reinterpret_cast<void*>(start), bytes, MADV_COLLAPSE) == 0;
  };
  const auto& chunks = pages.chunks;
  for (size_t i = 0; i < chunks.size();) {  // none when the huge page's size is unknown
    if (chunks[i].pages < kMinPagesToCollapse) {
      ++i;
      continue;
    }
    size_t j = i + 1;  // [i, j): adjacent chunks worth it
    while (j < chunks.size() && chunks[j].pages >= kMinPagesToCollapse &&
           chunks[j].start == chunks[j - 1].start + pages.chunkBytes) {
      ++j;
    }
    const bool all = collapse(chunks[i].start, (j - i) * pages.chunkBytes);
    for (; i < j; ++i) {
      if (all || collapse(chunks[i].start, pages.chunkBytes)) {
        collapsed.push_back(chunks[i].start);
        ++done.huge;
        done.hugePages += chunks[i].pages;
      }
    }
  }
  // Then each run, but for what lies in a collapsed chunk.
  size_t c = 0;
  for (const auto& run : pages.runs) {
    const uintptr_t end = run.start + run.bytes;
    for (uintptr_t at = run.start; at < end;) {
      while (c < collapsed.size() && collapsed[c] + pages.chunkBytes <= at) ++c;
      if (c < collapsed.size() && collapsed[c] <= at) {  // inside a collapsed chunk
        at = std::min<uintptr_t>(end, collapsed[c] + pages.chunkBytes);
        continue;
      }
      const uintptr_t stop = c < collapsed.size() ? std::min<uintptr_t>(end, collapsed[c]) : end;
      done.pages += touchRange(at, stop - at, pageSize);
      at = stop;
    }
  }
  done.pages += done.hugePages;
  return done;
}

}  // namespace ddprun::runtime
