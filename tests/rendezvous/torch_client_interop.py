"""The real torch 1.13 Python client against ddprun-store, for every operation it has.

Runs build/bin/ddprun-store on a free port (DDPRUN_BIN points at build/bin), then drives it
with torch.distributed.TCPStore(host, port, is_master=False) and checks each result. Ends with
two processes forming a real Gloo process group through the store and doing an allreduce.
"""
import datetime
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

BIN = os.environ.get("DDPRUN_BIN", os.path.join(os.path.dirname(__file__), "../../build/bin"))


def start_store(*extra):
    proc = subprocess.Popen([os.path.join(BIN, "ddprun-store"), "--port", "0",
                             "--host", "127.0.0.1", *extra],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("ddprun-store listening on "), line
    return proc, int(line.rsplit(":", 1)[1])


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok:", what)


def every_operation(port):
    t5 = datetime.timedelta(seconds=5)
    s = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=t5)
    s.set("key", "value")
    check(s.get("key") == b"value", "set then get")
    s.set("bin", bytes(range(256)))
    check(s.get("bin") == bytes(range(256)), "binary value with every byte")
    check(s.add("ctr", 5) == 5 and s.add("ctr", -2) == 3, "add")
    check(s.get("ctr") == b"3", "add stores ASCII decimal")
    check(s.compare_set("key", "value", "new") == b"new", "compare_set swaps")
    check(s.compare_set("key", "wrong", "x") == b"new", "compare_set keeps on mismatch")
    check(s.compare_set("fresh", "", "born") == b"born", "compare_set creates with empty expected")
    check(s.num_keys() == 4, "num_keys counts keys")
    check(s.delete_key("fresh") is True and s.delete_key("fresh") is False, "delete_key")
    s.wait(["key", "ctr"])
    s.wait(["key"], datetime.timedelta(seconds=1))
    print("ok: wait on present keys")

    t0 = time.time()
    try:
        s.wait(["never"], datetime.timedelta(milliseconds=300))
        raise AssertionError("wait on a missing key must time out")
    except RuntimeError as e:
        check("imeout" in str(e) or "Wait timeout" in str(e) or "timed out" in str(e).lower(),
              "wait on a missing key times out: " + str(e).splitlines()[0])
    check(time.time() - t0 < 5, "the timeout is honoured")

    # A second client sees the first one's keys, and get() blocks until a key appears.
    s2 = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=t5)
    check(s2.get("key") == b"new", "second client sees the data")
    s2.set_timeout(datetime.timedelta(seconds=3))

    p = dist.PrefixStore("job", s2)
    p.set("x", "1")
    check(s.get("job/x") == b"1", "PrefixStore keys are prefix/key")

    # world_size given: each client ADDs "init/" (torch 1.13 behaviour); the server keeps it.
    before = s.num_keys()
    dist.TCPStore("127.0.0.1", port, world_size=2, is_master=False, timeout=t5)
    check(s.num_keys() == before + 1, "a world_size client registers (its unprefixed init/ key)")


def gloo_worker(rank, port, world, results):
    store = dist.TCPStore("127.0.0.1", port, is_master=False,
                          timeout=datetime.timedelta(seconds=20))
    store = dist.PrefixStore("/worker/attempt_0", store)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    results[rank] = t.item()
    dist.barrier()
    dist.destroy_process_group()


def gloo_through_store(port):
    world = 2
    with mp.Manager() as m:
        results = m.dict()
        mp.spawn(gloo_worker, args=(port, world, results), nprocs=world, join=True)
        check(dict(results) == {0: 3.0, 1: 3.0}, "a Gloo process group forms through ddprun-store")


def main():
    proc, port = start_store()
    try:
        every_operation(port)
        gloo_through_store(port)
        check(proc.poll() is None, "the store is still running")
    finally:
        proc.terminate()
        proc.wait(5)
    print("all torch client interop checks passed")


if __name__ == "__main__":
    sys.exit(main())
