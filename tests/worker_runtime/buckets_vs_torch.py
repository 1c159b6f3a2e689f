"""DDP's bucket assignment against PyTorch's own (torch 1.13), parameter for parameter.

PyTorch assigns buckets in C++ (`dist._compute_bucket_assignment_by_size`, reducer.cpp). Its
DDP builds the buckets that hold in steady state when it rebuilds them after the first
iteration: over the parameters in the order their gradients became ready (for a feed-forward
model, reverse registration order), with the limits [_DEFAULT_FIRST_BUCKET_BYTES (1 MiB),
bucket_cap_mb (25 MiB)], each dtype with its own buckets and its own first limit. ddprun's
assignBuckets assumes that ready order. This test runs both on the same parameter lists --
hand-picked edge cases and seeded random models, mixed dtypes included -- and requires the
same buckets with the same parameters in the same order; with one dtype also the same order
of buckets (with several, torch appends the unfinished buckets in hash-map order, ddprun sorts
them into launch order, so only the set of buckets is compared).
"""
import os
import random
import subprocess
import sys

import torch
import torch.distributed as dist

DUMP = os.path.join(os.environ["DDPRUN_BIN"], "runtime_bucket_dump")
MiB = 1 << 20
TYPES = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "i64": torch.int64}
SIZE = {"f32": 4, "f64": 8, "f16": 2, "i64": 8}
FIRST, CAP = dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * MiB
assert FIRST == MiB, f"torch's first bucket is {FIRST} bytes, ddprun's default 1 MiB"


def torch_buckets(model):
    """PyTorch's assignment for `model` ([(dtype, bytes)] in registration order)."""
    tensors = [torch.empty(b // SIZE[t], dtype=TYPES[t]) for t, b in model]
    ready = list(reversed(range(len(model))))  # gradient-ready order of a feed-forward model
    indices, _ = dist._compute_bucket_assignment_by_size(
        [tensors[i] for i in ready], [FIRST, CAP], [False] * len(model), ready)
    return [list(b) for b in indices]


def models():
    # Edge cases: exactly at a cap, one byte under, one huge parameter, tiny ones, mixed dtypes.
    yield [("f32", MiB)] * 3
    yield [("f32", MiB - 4), ("f32", 4), ("f32", 25 * MiB - 4), ("f32", 4)]
    yield [("f32", 30 * MiB), ("f32", 4), ("f32", 4)]
    yield [("f32", MiB // 2)] * 4 + [("f32", 30 * MiB)] + [("f32", 3 * MiB)] * 10
    yield [("f32", 400), ("f64", 800), ("f32", 400), ("f16", 2 * MiB), ("f64", 2 * MiB)]
    yield [("f32", 4)]
    rng = random.Random(1234)
    for _ in range(60):
        n = rng.randint(1, 40)
        kinds = ["f32"] if rng.random() < 0.6 else ["f32", "f64", "f16", "i64"]
        model = []
        for _ in range(n):
            t = rng.choice(kinds)
            scale = rng.choice([64, 4096, 256 * 1024, 2 * MiB, 9 * MiB])
            model.append((t, SIZE[t] * rng.randint(1, scale // SIZE[t])))
        yield model


def main():
    cases = list(models())
    lines = "".join(" ".join(f"{t}:{b}" for t, b in m) + "\n" for m in cases)
    out = subprocess.run([DUMP], input=lines, check=True, capture_output=True, text=True).stdout
    ours_all = [[[int(x) for x in b.split()] for b in line.split("|")]
                for line in out.splitlines()]
    assert len(ours_all) == len(cases), f"{len(ours_all)} answers for {len(cases)} models"
    failures = 0
    for model, ours in zip(cases, ours_all):
        theirs = torch_buckets(model)
        one_type = len({t for t, _ in model}) == 1
        same = ours == theirs if one_type else sorted(ours) == sorted(theirs)
        if not same:
            failures += 1
            print(f"MISMATCH for {model}:\n  ddprun {ours}\n  torch  {theirs}")
    print(f"{len(cases)} models, {sum(len(m) for m in cases)} parameters: "
          f"{len(cases) - failures} assigned as PyTorch does")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
