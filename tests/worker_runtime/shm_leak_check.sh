#!/bin/sh
# shm_leak_check.sh PREFIX COMMAND...: runs COMMAND with DDPRUN_SHM_PREFIX=PREFIX-<pid> (the
# shared-memory segments it creates get that name prefix), then fails when any name with that
# prefix is still in /dev/shm. Exits with COMMAND's status otherwise.
prefix="$1-$$"
shift
DDPRUN_SHM_PREFIX="$prefix" "$@"
rc=$?
left=$(ls /dev/shm 2>/dev/null | grep -F "$prefix" || true)
if [ -n "$left" ]; then
  echo "LEFT IN /dev/shm: $left"
  exit 1
fi
echo "NOTHING LEFT in /dev/shm (prefix $prefix)"
exit $rc
