"""Hosts torch's own TCPStore server (Debian's python3-torch, torch 1.13) on a free loopback port
for a C++ test: prints "PORT <n>" once it listens, then serves until it is killed."""
import datetime
import sys
import time

import torch.distributed as dist

store = dist.TCPStore("127.0.0.1", 0, 1, True, datetime.timedelta(seconds=30),
                      wait_for_workers=False)
store.set("written-by-torch", "yes")
print("PORT %d" % store.port, flush=True)
while True:
    time.sleep(3600)
