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
// writes. A spare it forks copies them before it says ready (madvise MADV_POPULATE_WRITE, one
// call per run, then one read per page for the hypervisor's own tables), off the group's path.
//
// Only a help: an unreadable pagemap gives no pages, a kernel without MADV_POPULATE_WRITE
// (before 5.14) or a run unmapped since it was recorded is skipped, and a page touched in vain
// costs its copy and nothing else.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ddprun::runtime {

struct WrittenPages {
  struct Run {
    uintptr_t start = 0;
    size_t bytes = 0;
  };
  std::vector<Run> runs;  // page-aligned, ascending, not adjacent
  size_t pages = 0;       // in all runs
  size_t present = 0;     // present pages of the mappings looked at, exclusive or not
};

// The present pages of this process's private writable mappings that no other process maps
// (pagemap's "exclusively mapped" bit, Linux 4.2+). Meaningful in a process forked from another
// that is still alive: then they are the pages it wrote or allocated since (once the other has
// exited, every page is this one's alone: `pages` near `present` says so). Empty if
// /proc/self/pagemap or /proc/self/maps cannot be read.
WrittenPages exclusivePages();

// Writes the pages of `pages` in this process (breaking their sharing with its parent) without
// changing a byte; returns how many it touched. Call it only while this process has one thread
// (a run that another thread unmapped between the madvise and the read would fault).
size_t touchPages(const WrittenPages& pages);

}  // namespace ddprun::runtime
