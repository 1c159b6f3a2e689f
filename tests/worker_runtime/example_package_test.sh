#!/bin/sh
# The installed CMake package works for an outside project: install ddprun's runtime component
# into a temporary prefix, build examples/ against it with find_package(ddprun), run the example
# under ddprun with 2 workers, then again to check that it resumes from its checkpoint.
#   example_package_test.sh BUILD_DIR SOURCE_DIR DDPRUN
set -eu
build=$1 src=$2 ddprun=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/ddprun-example.XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" --component runtime > "$work/install.log"
test -f "$work/prefix/lib/cmake/ddprun/ddprunConfig.cmake"
cmake -S "$src/examples" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release > "$work/configure.log"
cmake --build "$work/build" -j 2 > "$work/build.log" || { cat "$work/build.log"; exit 1; }
"$ddprun" --standalone --nproc-per-node=2 "$work/build/ddp_example" "$work/ckpt" > "$work/run1.log" 2>&1 \
  || { cat "$work/run1.log"; exit 1; }
"$ddprun" --standalone --nproc-per-node=2 "$work/build/ddp_example" "$work/ckpt" > "$work/run2.log" 2>&1 \
  || { cat "$work/run2.log"; exit 1; }
cat "$work/run1.log" "$work/run2.log"
grep -q "rank 1/2 done" "$work/run1.log"
grep -q "resumed at epoch 3" "$work/run2.log"
echo "OK: find_package(ddprun) -> ddprun::runtime; example trained, checkpointed and resumed"
