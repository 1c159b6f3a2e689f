#include "worker_runtime/written_pages.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "base/unique_fd.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; glibc 2.36's headers do not name it
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

void addPage(WrittenPages& out, uintptr_t page, size_t pageSize) {
  ++out.pages;
  if (!out.runs.empty() && out.runs.back().start + out.runs.back().bytes == page) {
    out.runs.back().bytes += pageSize;
  } else {
    out.runs.push_back({.start = page, .bytes = pageSize});
  }
}

}  // namespace

WrittenPages exclusivePages() {
  WrittenPages out;
  const size_t pageSize = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const std::string maps = readAll("/proc/self/maps");
  const UniqueFd pagemap(::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC));
  if (maps.empty() || !pagemap) return out;
  std::vector<uint64_t> entries(8192);
  for (size_t at = 0; at < maps.size(); at = std::min(maps.find('\n', at), maps.size()) + 1) {
    unsigned long start = 0, end = 0;
    char perms[5] = {};
    // "start-end perms offset dev inode [path]": private writable mappings only (rw-p); a
    // shared one is written in place, without a copy.
    if (std::sscanf(maps.c_str() + at, "%lx-%lx %4s", &start, &end, perms) != 3) continue;
    if (std::strcmp(perms, "rw-p") != 0 || end <= start) continue;
    for (uintptr_t page = start; page < end;) {
      const size_t want = std::min(entries.size(), (end - page) / pageSize);
      const ssize_t got = ::pread(pagemap.get(), entries.data(), want * sizeof(uint64_t),
                                  static_cast<off_t>(page / pageSize * sizeof(uint64_t)));
      if (got <= 0) break;
      const size_t n = static_cast<size_t>(got) / sizeof(uint64_t);
      for (size_t i = 0; i < n; ++i) {
        if (!(entries[i] & kPresent)) continue;
        ++out.present;
        if (entries[i] & kExclusive) addPage(out, page + i * pageSize, pageSize);
      }
      page += n * pageSize;
    }
  }
  return out;
}

size_t touchPages(const WrittenPages& pages) {
  const size_t pageSize = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  size_t touched = 0;
  for (const auto& run : pages.runs) {
    // The copies in one call each run (a fault per page costs more); a run no longer mapped
    // writable (ENOMEM, EFAULT) or a kernel that knows no such advice (EINVAL) is skipped.
    if (::madvise(reinterpret_cast<void*>(run.start), run.bytes, MADV_POPULATE_WRITE) != 0) {
      continue;
    }
    // The madvise filled the kernel's page tables; on a VM with shadow page tables the first
    // access still traps once per page to fill the hypervisor's. A read does that.
    for (size_t off = 0; off < run.bytes; off += pageSize) {
      (void)*reinterpret_cast<const volatile char*>(run.start + off);
    }
    touched += run.bytes / pageSize;
  }
  return touched;
}

}  // namespace ddprun::runtime
