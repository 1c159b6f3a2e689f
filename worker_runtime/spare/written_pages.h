#pragma once
// The pages a process made its own since it was forked, and a later fork's pre-touch of them
// (the spare template forked from a rank; spare_template.h, docs/recovery.md#spare-template).
//
// Why: a spare forked from the template shares every page with it, and its first write to each
// is a copy-on-write fault. On a VM with shadow page tables (PVM here) one such fault costs
// 15-30 us, and a replacement's heal and first steps took ~1,300 of them (the allocator chunks
// autograd and the optimizer write, which the template's warm-up wrote before) while the whole
// group waited for it. Which pages those are, the template can tell: every page it had when it
// was forked from the rank was shared with that rank, so after its warm-up the pages it maps
// exclusively (/proc/self/pagemap) are the ones the warm-up wrote or allocated -- what a step
// writes. A spare it forks copies them before it says ready, off the group's path:
// - where they lie in a 2 MB-aligned range wholly inside an anonymous mapping (the allocator's
//   heap and arenas: most of them), with enough of them to pay for it, the kernel copies the
//   whole range into one huge page of the spare's own (madvise MADV_COLLAPSE, Linux 6.1). Here
//   that took 0.3-0.7 ms per 2 MB where 512 copy-on-write faults take 5-9 ms, and the
//   hypervisor maps it once, not per page: the spare's later accesses to it cost nothing;
// - the rest page by page: madvise MADV_POPULATE_WRITE per run, then one read per page for
//   the hypervisor's own tables.
//
// Only a help: an unreadable pagemap gives no pages, a kernel without MADV_COLLAPSE (or with
// transparent huge pages off) falls back to the pages one by one, a kernel without
// MADV_POPULATE_WRITE (before 5.14) or a run unmapped since it was recorded is skipped, and a
// page touched in vain costs its copy and nothing else (a huge page also its 2 MB of memory).
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ddprun::runtime {

struct WrittenPages {
  struct Run {
    uintptr_t start = 0;
    size_t bytes = 0;
  };
  // A 2 MB-aligned range (the kernel's huge page, hpage_pmd_size) wholly inside one anonymous
  // private mapping, and how many of the runs' pages lie in it.
  struct Chunk {
    uintptr_t start = 0;
    size_t pages = 0;
  };
  std::vector<Run> runs;      // page-aligned, ascending, not adjacent
  std::vector<Chunk> chunks;  // ascending; only those holding a page of `runs`
  size_t chunkBytes = 0;      // the huge page's size; 0: unknown, no chunks
  size_t pages = 0;           // in all runs
  size_t present = 0;         // present pages of the mappings looked at, exclusive or not
};

// What touchPages() did: `pages` of the runs' pages made this process's own, `hugePages` of
// them by copying `huge` chunks whole.
struct Touched {
  size_t pages = 0;
  size_t hugePages = 0;
  size_t huge = 0;
};

// The present pages of this process's private writable mappings that no other process maps
// (pagemap's "exclusively mapped" bit, Linux 4.2+). Meaningful in a process forked from another
// that is still alive: then they are the pages it wrote or allocated since (once the other has
// exited, every page is this one's alone: `pages` near `present` says so). Empty if
// /proc/self/pagemap or /proc/self/maps cannot be read.
WrittenPages exclusivePages();

// A chunk holding fewer of the runs' pages is copied page by page: its collapse copies all 512
// (0.3-0.7 ms here, the cost of 30-60 page faults) and keeps 2 MB.
constexpr size_t kMinPagesToCollapse = 64;

// Makes the pages of `pages` this process's own (breaking their sharing with its parent)
// without changing a byte: the chunks holding at least kMinPagesToCollapse of them as huge
// pages, the rest page by page. Call it only while this process has one thread (a run that
// another thread unmapped between the madvise and the read would fault).
Touched touchPages(const WrittenPages& pages);

}  // namespace ddprun::runtime
