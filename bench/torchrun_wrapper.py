#!/usr/bin/env python3
"""torchrun from Debian's python3-torch 1.13, made to run under Python 3.11.

    /usr/bin/python3 bench/torchrun_wrapper.py [torchrun flags] PROGRAM [ARGS...]

Debian 12's torchrun crashes at start: Std.from_str (torch/distributed/elastic/
multiprocessing/api.py) iterates over an IntFlag to map "0".."3" to members, and Python 3.11
no longer yields the composite member ALL (3) when iterating, so from_str returns None and
the launch fails. This wrapper replaces from_str, at import time and in this process only,
with a version that builds the member with Std(int(v)), then runs torch.distributed.run.main()
exactly as the torchrun script does. The installed torch is not modified.

torch 1.13 spells its flags with underscores only (--nproc_per_node, --monitor_interval).
Used by the launch and training benchmarks (ddprun-bench launch, ddprun-bench train) and the
launcher's environment-comparison test.
"""
import re
import sys

from torch.distributed.elastic.multiprocessing import api as _api


def _std_from_str(cls, vm):
    if re.match(_api._VALUE_REGEX, vm):
        return cls(int(vm))
    if re.match(_api._MAPPING_REGEX, vm):
        return {int(rank): cls(int(value))
                for rank, value in (item.split(":") for item in vm.split(","))}
    raise ValueError(f"{vm} does not match: <{_api._VALUE_REGEX}> or <{_api._MAPPING_REGEX}>")


_api.Std.from_str = classmethod(_std_from_str)

if __name__ == "__main__":
    from torch.distributed.run import main

    sys.exit(main())
