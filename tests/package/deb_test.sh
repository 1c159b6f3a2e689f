#!/bin/sh
# The Debian package, as a user gets it: build it (scripts/package), unpack it into a temporary
# root (dpkg-deb -x), and from there: `ddprun --version` names version and git revision, a
# 2-worker standalone job runs, the man pages and the bash completion work, examples/ builds
# against its CMake package (find_package(ddprun)) and trains under the packaged ddprun; lintian
# reports no error.
#   deb_test.sh SOURCE_DIR BUILD_DIR
set -eu
src=$1 build=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/ddprun-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
step() { echo "== $*"; }

step "scripts/package"
start=$(date +%s)
BUILD_DIR="$build" "$src/scripts/package" > "$work/package.log" 2>&1 || { cat "$work/package.log"; fail "scripts/package"; }
version=$(sed -n 's/^project(ddprun VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
deb="$build/package/ddprun_${version}_amd64.deb"
[ -f "$deb" ] || fail "no $deb (got: $(ls "$build/package"))"
echo "$deb: $(du -h "$deb" | cut -f1), built in $(( $(date +%s) - start )) s"

step "control fields"
dpkg-deb -f "$deb" Package Version Architecture Depends | tee "$work/control"
grep -qx "Version: $version" "$work/control" || fail "Version"
for dep in libtorch1.13 libgloo0 libssl3 libstdc++6 libc6; do
  grep -q "^Depends:.*\b$dep\b" "$work/control" || fail "Depends lacks $dep"
done

step "dpkg-deb -x"
root="$work/root"
dpkg-deb -x "$deb" "$root"
for f in usr/bin/ddprun usr/bin/ddprun-store usr/bin/ddprun-bench usr/lib/libddprun_runtime.a \
         usr/include/ddprun/worker_runtime/ddprun.h usr/lib/cmake/ddprun/ddprunConfig.cmake \
         usr/share/man/man1/ddprun.1.gz usr/share/man/man1/ddprun-store.1.gz \
         usr/share/bash-completion/completions/ddprun usr/share/doc/ddprun/copyright; do
  [ -e "$root/$f" ] || fail "the package has no /$f"
done

step "ddprun --version"
"$root/usr/bin/ddprun" --version | tee "$work/version"
grep -Eqx "ddprun $version \(git ([0-9a-f]{12}(-dirty)?|unknown)\)" "$work/version" || fail "--version"

step "a standalone job with the packaged ddprun"
"$root/usr/bin/ddprun" --standalone --nproc-per-node=2 sh -c 'echo "rank $RANK of $WORLD_SIZE"' \
  > "$work/job.out" 2> "$work/job.err" || { cat "$work/job.err"; fail "the job failed"; }
cat "$work/job.out"
grep -qx '\[rank 0\]: rank 0 of 2' "$work/job.out" || fail "rank 0's line"
grep -qx '\[rank 1\]: rank 1 of 2' "$work/job.out" || fail "rank 1's line"

step "man pages"
zcat "$root/usr/share/man/man1/ddprun.1.gz" | grep -q -- 'nproc\\-per\\-node' || fail "ddprun.1 lacks the flags"
zcat "$root/usr/share/man/man1/ddprun-store.1.gz" | grep -q -- 'auth\\-token\\-file' || fail "ddprun-store.1"
if command -v man > /dev/null; then
  MANWIDTH=80 man -l "$root/usr/share/man/man1/ddprun.1.gz" 2>/dev/null | head -5
fi

step "bash completion"
if [ -f /usr/share/bash-completion/bash_completion ]; then
  got=$(bash -c '. /usr/share/bash-completion/bash_completion; . "$1"
    COMP_WORDS=(ddprun --nproc); COMP_CWORD=1; COMP_LINE="ddprun --nproc"; COMP_POINT=${#COMP_LINE}
    _ddprun; echo "${COMPREPLY[*]}"
    COMP_WORDS=(ddprun --rdzv-backend ""); COMP_CWORD=2; COMP_LINE="ddprun --rdzv-backend "
    COMP_POINT=${#COMP_LINE}; _ddprun; echo "${COMPREPLY[*]}"' _ "$root/usr/share/bash-completion/completions/ddprun")
  echo "$got"
  echo "$got" | head -1 | grep -qx -- '--nproc-per-node --nproc_per_node' || fail "flag completion"
  echo "$got" | tail -1 | grep -qx 'static c10d' || fail "value completion"
else
  echo "(bash-completion not installed: only a syntax check)"
  bash -n "$root/usr/share/bash-completion/completions/ddprun" || fail "completion syntax"
fi

step "examples/ against the package's CMake package"
start=$(date +%s)
launcher=""
command -v ccache > /dev/null && launcher="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
cmake -S "$src/examples" -B "$work/example" -G Ninja -DCMAKE_PREFIX_PATH="$root/usr" \
  -DCMAKE_BUILD_TYPE=Release $launcher > "$work/configure.log" 2>&1 || { cat "$work/configure.log"; fail "configure"; }
grep -q "$root/usr/lib/cmake/ddprun" "$work/example/CMakeCache.txt" || fail "ddprun not found in the package"
cmake --build "$work/example" -j 2 > "$work/build.log" 2>&1 || { cat "$work/build.log"; fail "build"; }
"$root/usr/bin/ddprun" --standalone --nproc-per-node=2 "$work/example/ddp_example" "$work/ckpt" \
  > "$work/run.log" 2>&1 || { cat "$work/run.log"; fail "the example's job"; }
grep -q "rank 1/2 done" "$work/run.log" || { cat "$work/run.log"; fail "the example did not finish"; }
echo "built and trained in $(( $(date +%s) - start )) s"

step "lintian"
if command -v lintian > /dev/null; then
  start=$(date +%s)
  lintian --tag-display-limit 0 "$deb" > "$work/lintian.log" 2>&1 || true
  cat "$work/lintian.log"
  ! grep -q '^E: ' "$work/lintian.log" || fail "lintian reports errors"
  echo "lintian: no error ($(( $(date +%s) - start )) s)"
else
  fail "lintian is not installed (scripts/setup installs it)"
fi
echo "OK: $deb"
