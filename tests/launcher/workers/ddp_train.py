"""A PyTorch DDP training script as the tutorials write it (gloo, CPU), for ddprun's tests.

DistributedSampler with set_epoch, DistributedDataParallel, an explicit allreduce, rank 0
saving a checkpoint. It checks what it can check from inside: the sampler's shards are
disjoint and cover the data set, the allreduce sums the ranks, the replicas stay identical.
--fail-once-rank R makes rank R raise on the first attempt (TORCHELASTIC_RESTART_COUNT=0),
after the process group has been used, to exercise a restart with a fresh store attempt.
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


@record
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--fail-once-rank", type=int, default=-1)
    args = parser.parse_args()

    dist.init_process_group("gloo")  # env://: MASTER_ADDR/PORT, RANK, WORLD_SIZE from ddprun
    rank, world = dist.get_rank(), dist.get_world_size()
    assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])

    torch.manual_seed(0)
    features = torch.randn(512, 8)
    labels = (features.sum(dim=1) > 0).long()
    dataset = TensorDataset(torch.arange(len(features)), features, labels)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=1)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)

    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()
    previous_order = None
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        seen = []
        for step, (index, x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            seen.extend(index.tolist())
            if rank == args.fail_once_rank and attempt == 0 and step == 1:
                raise RuntimeError(f"injected failure on rank {rank}, attempt {attempt}")
        shards = [None] * world
        dist.all_gather_object(shards, seen)
        everything = sorted(i for shard in shards for i in shard)
        assert everything == list(range(len(dataset))), "shards must cover the data set once"
        assert previous_order != seen, "set_epoch must reshuffle"
        previous_order = seen

    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    assert total.item() == world * (world + 1) / 2, total
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    mean = flat.clone()
    dist.all_reduce(mean)
    mean /= world
    assert torch.allclose(flat, mean), "replicas diverged"

    if rank == 0:
        tmp = args.checkpoint + ".tmp"
        torch.save({"model": model.module.state_dict(), "epochs": args.epochs,
                    "world_size": world, "attempt": attempt}, tmp)
        os.replace(tmp, args.checkpoint)
    dist.barrier()
    print(f"rank {rank}/{world} attempt {attempt}: loss {loss.item():.4f} allreduce {total.item():g} "
          f"store {'agent' if os.environ['TORCHELASTIC_USE_AGENT_STORE'] == 'True' else 'own'}",
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
