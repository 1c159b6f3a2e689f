#!/usr/bin/python3
"""PyTorch DDP reference for `ddprun-bench train`: the idiomatic Python counterpart of
build/bin/mnist_mlp (and mnist_cnn), run under torchrun with the gloo backend on CPU.

Same model shapes, the same data (MNIST idx .gz files, normalised with the same constants),
the same per-rank batch, optimizer (SGD with momentum), learning rate and number of steps as
the C++ trainer, fed the usual way: TensorDataset + DistributedSampler + DataLoader.

Rank 0 appends one JSON line to --metrics when done, in the same shape as the C++ trainer's
summary line: {"kind": "summary", "steps", "samples", "train_seconds", "samples_per_sec",
"final_loss", ...}. final_loss is rank 0's mean training loss over the last (up to) 50 steps.

With --checkpoint-dir (and --checkpoint-interval N), rank 0 saves model, optimizer and position
every N steps (torch.save to a temporary name, then os.replace: a file under its final name is
complete; the newest two are kept), and every rank resumes from the newest at start, as a
torchrun user's script does to survive --max_restarts (ddprun-bench recovery).
"""
import argparse
import glob
import gzip
import itertools
import json
import os
import re
import struct
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

# Fashion-MNIST training-set statistics; the C++ trainer uses the same constants.
PIXEL_MEAN = 0.2860
PIXEL_STD = 0.3530


def read_idx_gz(path, limit):
    with gzip.open(path, "rb") as f:
        magic = f.read(4)
        ndims = magic[3]
        dims = list(struct.unpack(">" + "I" * ndims, f.read(4 * ndims)))
        if limit:
            dims[0] = min(dims[0], limit)
        count = 1
        for d in dims:
            count *= d
        data = torch.frombuffer(bytearray(f.read(count)), dtype=torch.uint8)
    return data.reshape(dims)


def load_split(data_dir, prefix, limit):
    images = read_idx_gz(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"), limit)
    labels = read_idx_gz(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"), limit)
    x = (images.reshape(-1, 784).float() / 255.0 - PIXEL_MEAN) / PIXEL_STD
    return TensorDataset(x, labels.long())


class Mlp(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc1 = nn.Linear(784, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class ResidualBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return F.relu(x + self.conv2(F.relu(self.conv1(x))))


class ResidualCnn(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.stem = nn.Conv2d(1, width, 3, padding=1)
        self.block1 = ResidualBlock(width)
        self.down = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)
        self.block2 = ResidualBlock(2 * width)
        self.head = nn.Linear(2 * width, 10)

    def forward(self, x):
        x = x.view(-1, 1, 28, 28)
        x = F.max_pool2d(F.relu(self.stem(x)), 2)
        x = self.block2(F.relu(self.down(self.block1(x))))
        return self.head(x.mean(dim=(2, 3)))


def newest_checkpoint(directory):
    """The path of the newest ckpt-<step>.pt in directory, or None."""
    found = []
    for path in glob.glob(os.path.join(directory, "ckpt-*.pt")):
        m = re.fullmatch(r"ckpt-(\d+)\.pt", os.path.basename(path))
        if m:
            found.append((int(m.group(1)), path))
    return max(found)[1] if found else None


def save_checkpoint(directory, state, keep=2):
    """Atomically writes ckpt-<step>.pt, then drops all but the newest `keep`."""
    path = os.path.join(directory, f"ckpt-{state['step']}.pt")
    tmp = f"{path}.tmp-{os.getpid()}"
    torch.save(state, tmp)
    os.replace(tmp, path)
    steps = sorted(int(re.fullmatch(r"ckpt-(\d+)\.pt", os.path.basename(p)).group(1))
                   for p in glob.glob(os.path.join(directory, "ckpt-*.pt")))
    for old in steps[:-keep]:
        os.remove(os.path.join(directory, f"ckpt-{old}.pt"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--train-limit", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--steps", type=int, default=1000, help="optimizer steps in total")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--metrics", default="")
    p.add_argument("--checkpoint-dir", default="")
    p.add_argument("--checkpoint-interval", type=int, default=0, help="steps; 0: none")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)

    train = load_split(args.data, "train", args.train_limit)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    model = Mlp(args.hidden) if args.model == "mlp" else ResidualCnn(args.width)
    step, epoch, skip = 0, 0, 0  # skip: batches of `epoch` already trained
    resumed = None
    if args.checkpoint_dir:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        latest = newest_checkpoint(args.checkpoint_dir)
        if latest:
            resumed = torch.load(latest)
            model.load_state_dict(resumed["model"])
            step, epoch, skip = resumed["step"], resumed["epoch"], resumed["batch"]
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)
    if resumed:
        opt.load_state_dict(resumed["optimizer"])
        if rank == 0:
            print(f"resumed from checkpoint at step {step}", flush=True)

    recent = []
    dist.barrier()
    start = time.perf_counter()
    while step < args.steps:
        sampler.set_epoch(epoch)
        batch = skip
        for x, y in itertools.islice(loader, skip, None):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            recent.append(loss.item())
            del recent[:-50]
            step += 1
            batch += 1
            if rank == 0 and args.checkpoint_interval and step % args.checkpoint_interval == 0:
                save_checkpoint(args.checkpoint_dir,
                                {"model": model.state_dict(), "optimizer": opt.state_dict(),
                                 "step": step, "epoch": epoch, "batch": batch})
            if step >= args.steps:
                break
        skip = 0
        epoch += 1
    dist.barrier()
    seconds = time.perf_counter() - start

    if rank == 0:
        samples = step * args.batch_size * world
        summary = {"kind": "summary", "trainer": "pytorch-ddp", "model": args.model,
                   "world_size": world, "steps": step, "samples": samples,
                   "train_seconds": seconds, "samples_per_sec": samples / seconds,
                   "final_loss": sum(recent) / len(recent),
                   "torch_threads": torch.get_num_threads()}
        print(json.dumps(summary), flush=True)
        if args.metrics:
            with open(args.metrics, "a") as f:
                f.write(json.dumps(summary) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
