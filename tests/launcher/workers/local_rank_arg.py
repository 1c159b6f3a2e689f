"""A script written for the old torch.distributed.launch: it reads --local_rank."""
import argparse
import os

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, required=True)
parser.add_argument("--out", required=True)
args = parser.parse_args()
assert args.local_rank == int(os.environ["LOCAL_RANK"])
with open(f"{args.out}.{args.local_rank}", "w") as f:
    f.write(f"{args.local_rank} {os.environ['RANK']}\n")
