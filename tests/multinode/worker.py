"""A worker for the multi-node tests (plain python3, no torch).

It records the environment ddprun gave it (one JSON file per start), meets every other rank
of its round in the store at MASTER_ADDR:MASTER_PORT (a barrier over the TCPStore protocol,
so all ranks of all nodes must agree on MASTER_ADDR/PORT and WORLD_SIZE), then does what its
arguments say:

  --finish-at-world N   exit 0 when WORLD_SIZE == N, else run until stopped
  --gate FILE           with --finish-at-world: finish only once FILE exists (the test creates
                        it when the round that may finish is about to form)
  --fail-once K CODE    the first time in the job a worker runs on node rank K (local rank 0),
                        exit CODE (the marker is shared by the job's nodes, next to their --out
                        directories: with arrival ranks node rank K may move to another node)
  --always-fail K CODE  exit CODE whenever it runs on node rank K (local rank 0)
  --run S               run S seconds, then exit 0 (default: exit 0 at once)
  --exit-when FILE      run until FILE exists, then exit 0
  --fatal K CODE        on node rank K (local rank 0) write an error file that says a restart
                        cannot help (as ddprun::runtime::recordError does), then exit CODE
"""
import argparse
import json
import os
import socket
import struct
import sys
import time

# TCPStore's current dialect: u8 command, strings as u64 length + bytes.
VALIDATE, SET, ADD, WAIT = 0, 1, 4, 6
MAGIC = 0x3C85F7CE


def _s(b):
    return struct.pack("<Q", len(b)) + b


class Store:
    def __init__(self, host, port, timeout=30.0):
        deadline = time.time() + timeout
        while True:
            try:
                self.sock = socket.create_connection((host, port), timeout=timeout)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.02)  # the store of this round may still be starting
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(struct.pack("<BI", VALIDATE, MAGIC))

    def _read(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("store closed the connection")
            buf += chunk
        return buf

    def add(self, key, delta):
        self.sock.sendall(bytes([ADD]) + _s(key.encode()) + struct.pack("<q", delta))
        return struct.unpack("<q", self._read(8))[0]

    def set(self, key, value):
        self.sock.sendall(bytes([SET]) + _s(key.encode()) + _s(value.encode()))

    def wait(self, key):
        self.sock.sendall(bytes([WAIT]) + struct.pack("<Q", 1) + _s(key.encode()))
        if self._read(1) != b"\x00":
            raise RuntimeError("unexpected WAIT reply")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--finish-at-world", type=int)
    p.add_argument("--gate")
    p.add_argument("--fail-once", nargs=2, type=int)
    p.add_argument("--always-fail", nargs=2, type=int)
    p.add_argument("--run", type=float, default=0.0)
    p.add_argument("--exit-when")
    p.add_argument("--fatal", nargs=2, type=int)
    p.add_argument("--start-gate", help="after the barrier, wait until this file exists")
    a = p.parse_args()
    started = time.time()
    env = {k: os.environ.get(k, "") for k in (
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_USE_AGENT_STORE", "DDPRUN_STORE_TOKEN_FILE")}
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    group, local = int(env["GROUP_RANK"]), int(env["LOCAL_RANK"])

    # The barrier: every rank of the round adds 1; the last one opens the gate.
    store = Store(env["MASTER_ADDR"], int(env["MASTER_PORT"]))
    arrived = store.add("arrived", 1)
    if arrived == world:
        store.set("gate", "open")
    store.wait("gate")
    record = dict(env, pid=os.getpid(), started=started, arrived=arrived, passed=time.time())
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "start-%d-%f.json" % (os.getpid(), started))
    with open(path + ".tmp", "w") as f:  # rename: the test never reads half a record
        json.dump(record, f)
    os.rename(path + ".tmp", path)
    print("worker rank %d of %d started (node rank %d)" % (rank, world, group), flush=True)
    while a.start_gate and not os.path.exists(a.start_gate):  # the test is ready for what follows
        time.sleep(0.01)

    if local == 0 and a.fatal and group == a.fatal[0]:
        record = {"message": {
            "message": "IncompatibleCheckpoint: checkpoint ckpt-7 does not fit",
            "extraInfo": {"timestamp": str(int(time.time())),
                          "exceptionType": "ddprun::runtime::IncompatibleCheckpoint",
                          "retryable": False}}}
        path = os.environ["TORCHELASTIC_ERROR_FILE"]
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.rename(path + ".tmp", path)
        sys.exit(a.fatal[1])
    if local == 0 and a.always_fail and group == a.always_fail[0]:
        sys.exit(a.always_fail[1])
    if local == 0 and a.fail_once and group == a.fail_once[0]:
        marker = os.path.join(os.path.dirname(os.path.abspath(a.out)), "failed-once")
        if not os.path.exists(marker):
            open(marker, "w").close()
            print("worker rank %d fails on purpose" % rank, flush=True)
            sys.exit(a.fail_once[1])
    if a.exit_when:
        while not os.path.exists(a.exit_when):
            time.sleep(0.01)
        sys.exit(0)
    if a.finish_at_world is not None:
        if world == a.finish_at_world and (not a.gate or os.path.exists(a.gate)):
            sys.exit(0)
        time.sleep(3600)  # until ddprun stops us for the next round
    time.sleep(a.run)


if __name__ == "__main__":
    main()
