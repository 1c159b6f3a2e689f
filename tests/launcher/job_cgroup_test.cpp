// Where ddprun looks for its job cgroup (launcher/job_cgroup.h): the pure lookup from the text
// of /proc/self/mountinfo and /proc/self/cgroup, on the layouts of real machines.
#include <catch2/catch.hpp>

#include "launcher/job_cgroup.h"

using ddprun::launcher::findOwnCgroup2;

namespace {
// A hybrid host (systemd's cgroup v1 layout, cgroup2 at /sys/fs/cgroup/unified), as on this
// project's sandboxes.
const char* kHybrid =
    "25 31 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    "42 31 0:39 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n";
// A pure cgroup v2 systemd host.
const char* kUnified =
    "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n";
}  // namespace

TEST_CASE("the own cgroup v2 directory: hybrid and unified hosts, the root cgroup",
          "[launcher][cgroup]") {
  auto r = findOwnCgroup2(kHybrid, "4:memory:/x\n0::/\n");
  CHECK(r.dir == "/sys/fs/cgroup/unified");
  CHECK(r.whyNot.empty());
  r = findOwnCgroup2(kUnified, "0::/user.slice/user-1000.slice/session-3.scope\n");
  CHECK(r.dir == "/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope");
}

TEST_CASE("the own cgroup v2 directory: a mount of a subtree, an escaped mount point",
          "[launcher][cgroup]") {
  // A container that bind-mounts its part of the hierarchy.
  const char* sub = "50 40 0:30 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
  CHECK(findOwnCgroup2(sub, "0::/kubepods/pod1/c1\n").dir == "/sys/fs/cgroup/c1");
  CHECK(findOwnCgroup2(sub, "0::/kubepods/pod1\n").dir == "/sys/fs/cgroup");
  // /kubepods/pod10 is not under /kubepods/pod1.
  CHECK(findOwnCgroup2(sub, "0::/kubepods/pod10\n").dir.empty());
  CHECK(findOwnCgroup2("50 40 0:30 / /mnt/my\\040cg rw - cgroup2 none rw\n", "0::/a\n").dir ==
        "/mnt/my cg/a");
}

TEST_CASE("no own cgroup v2 directory: v1 only, not mounted, read-only, outside the namespace",
          "[launcher][cgroup]") {
  auto r = findOwnCgroup2(kHybrid, "4:memory:/x\n1:name=systemd:/\n");
  CHECK(r.dir.empty());
  CHECK_THAT(r.whyNot, Catch::Contains("cgroup v1 only"));
  r = findOwnCgroup2("42 31 0:39 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n", "0::/\n");
  CHECK(r.dir.empty());
  CHECK_THAT(r.whyNot, Catch::Contains("no cgroup2 mount"));
  r = findOwnCgroup2("41 31 0:38 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n", "0::/a\n");
  CHECK(r.dir.empty());
  CHECK_THAT(r.whyNot, Catch::Contains("read-only at /sys/fs/cgroup"));
  r = findOwnCgroup2(kUnified, "0::/../../system.slice\n");
  CHECK(r.dir.empty());
  CHECK_THAT(r.whyNot, Catch::Contains("outside its cgroup namespace"));
}
