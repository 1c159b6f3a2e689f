"""A PyTorch worker for the multi-node tests: torch.distributed over env:// (gloo), as a
torchrun user writes it. It records its start like worker.py, all-reduces its rank, checks the
sum, and finishes when WORLD_SIZE reaches --finish-at-world (else it waits to be stopped)."""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--finish-at-world", type=int, required=True)
    a = p.parse_args()
    started = time.time()
    dist.init_process_group("gloo")  # MASTER_ADDR/PORT, RANK, WORLD_SIZE from ddprun
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    expected = world * (world - 1) / 2
    record = {k: os.environ.get(k, "") for k in (
        "RANK", "WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE")}
    record.update(started=started, passed=time.time(), sum=t.item(), expected=expected)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "start-%d-%f.json" % (os.getpid(), started))
    with open(path + ".tmp", "w") as f:  # rename: the test never reads half a record
        json.dump(record, f)
    os.rename(path + ".tmp", path)
    print("rank %d of %d: all_reduce sum %g (expected %g)" % (rank, world, t.item(), expected),
          flush=True)
    if t.item() != expected:
        sys.exit(5)
    dist.barrier()
    if world == a.finish_at_world:
        dist.destroy_process_group()
        return
    time.sleep(3600)  # until ddprun stops us for the next round


if __name__ == "__main__":
    main()
