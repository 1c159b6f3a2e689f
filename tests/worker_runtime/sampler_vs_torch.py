"""Our DistributedSampler against torch.utils.data.DistributedSampler (torch 1.13), index for index.

Runs runtime_sampler_dump (C++, LibTorch's generator and randperm) once for many sizes, replica
counts, seeds and epochs, with and without shuffle and drop_last, and compares every rank's list
with what PyTorch's own sampler yields.
"""
import itertools
import os
import subprocess
import sys

import torch
from torch.utils.data.distributed import DistributedSampler

dump = os.path.join(os.environ["DDPRUN_BIN"], "runtime_sampler_dump")
configs = list(itertools.product([1, 7, 10, 60000, 100003], [1, 2, 3, 4], [0, 42], [0, 3],
                                 [True, False], [False, True]))
lines = "".join(f"{n} {r} {seed} {epoch} {int(sh)} {int(dl)}\n"
                for n, r, seed, epoch, sh, dl in configs)
out = subprocess.run([dump], input=lines, check=True, capture_output=True, text=True).stdout
blocks = out.split("end\n")
checked = 0
for (n, replicas, seed, epoch, shuffle, drop_last), block in zip(configs, blocks):
    ours = [[int(x) for x in line.split()] for line in block.split("\n")[:replicas]]
    for rank in range(replicas):
        s = DistributedSampler(range(n), num_replicas=replicas, rank=rank, shuffle=shuffle,
                               seed=seed, drop_last=drop_last)
        s.set_epoch(epoch)
        theirs = list(iter(s))
        if ours[rank] != theirs:
            print(f"MISMATCH n={n} replicas={replicas} seed={seed} epoch={epoch} "
                  f"shuffle={shuffle} drop_last={drop_last} rank={rank}:\n"
                  f"  ddprun {ours[rank][:20]}...\n  torch  {theirs[:20]}...")
            sys.exit(1)
        checked += 1
if checked != sum(c[1] for c in configs):
    print(f"expected {sum(c[1] for c in configs)} rank lists, compared {checked}")
    sys.exit(1)
print(f"OK: {checked} rank lists identical to torch {torch.__version__}'s DistributedSampler")
