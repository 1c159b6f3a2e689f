"""Fault injection on a 2-node elastic job: the real mnist_mlp under two real ddprun agents on
loopback aliases (127.0.0.2 hosts the rendezvous store, 127.0.0.3), --nnodes=1:2, one worker
per node, checkpoints every 10 steps. A clean run gives the reference accuracy; then each fault
of a seeded series (DDPRUN_TEST_SEED, printed; the order and the step each lands at are drawn
from it) runs in a job of its own. For each: no hang (every wait is bounded), nothing left
running (zombies count as dead), the right exit code on every node, and, where training
completes, the test accuracy within 0.005 of the clean run's.

Usage: fault_scenarios.py fault_series   (exit 0 / 1 / 77)
"""
import glob
import os
import random
import re
import signal
import sys
import time

import harness
from harness import TRAINING_CONF, check, run, skip_unless_ci

MLP = os.path.join(harness.BIN, "mnist_mlp")
DATA = "/usr/share/datasets/fashion-mnist"
TOLERANCE = 0.005


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def marked(mark):
    """Every live process whose environment carries DDPRUN_FAULT_MARK=mark: the agents, their
    guards and their workers all inherit it."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % d, "rb") as f:
                if ("DDPRUN_FAULT_MARK=%s" % mark).encode() in f.read().split(b"\0"):
                    if alive(int(d)):
                        pids.append(int(d))
        except OSError:
            pass
    return pids


def state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0]
    except OSError:
        return None


def stop(pid):
    """SIGSTOP, returning once the process is stopped (delivery is asynchronous)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.time() + 10
    while state(pid) not in ("T", "t", None, "Z") and time.time() < deadline:
        time.sleep(0.005)


def worker_pid(mark, node_addr=None, rank=None):
    """The mnist_mlp worker started by the agent of `node_addr`, or the one of global `rank`
    (by its environment)."""
    want = ("DDPRUN_FAULT_NODE=%s" % node_addr) if rank is None else ("RANK=%d" % rank)
    for pid in marked(mark):
        try:
            with open("/proc/%d/comm" % pid) as f:
                if f.read().strip() != "mnist_mlp":
                    continue
            with open("/proc/%d/environ" % pid, "rb") as f:
                env = f.read().split(b"\0")
            if want.encode() in env:
                return pid
        except OSError:
            pass
    return None


class Job:
    """One 2-node training job with its own checkpoint directory and rendezvous id."""
    count = 0

    def __init__(self, t, name):
        Job.count += 1
        self.t, self.name = t, name
        self.mark = "%s-%d-%d" % (name, os.getpid(), Job.count)
        self.dir = os.path.join(t.dir, name)
        os.makedirs(self.dir)
        self.ckpt = os.path.join(self.dir, "ckpt")
        self.port = harness.free_port("127.0.0.2")
        self.nodes = []

    def agent(self, label, addr, extra=()):
        args = ["--nnodes=1:2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                "--rdzv-endpoint=127.0.0.2:%d" % self.port, "--rdzv-id=%s" % self.mark,
                "--local-addr=%s" % addr, "--rdzv-conf=%s" % TRAINING_CONF, "--max-restarts=3",
                "--stall-warning=1"] + list(extra) + [
                MLP, "--train-limit", "4096", "--test-limit", "0", "--epochs", "3",
                "--batch-size", "16", "--seed", "5", "--lr", "0.05",
                "--log-interval", "1000", "--lr-scaling", "linear", "--checkpoint-dir", self.ckpt,
                "--checkpoint-interval", "10"]
        n = harness.Node(self.t, "%s-%s" % (self.name, label), args,
                         env={"DDPRUN_FAULT_MARK": self.mark, "DDPRUN_FAULT_NODE": addr,
                              "OMP_NUM_THREADS": "1"})
        self.nodes.append(n)
        return n

    def start(self, extra=()):
        self.a = self.agent("a", "127.0.0.2", extra)
        self.b = self.agent("b", "127.0.0.3", extra)
        return self

    def checkpoints(self):
        """(step, path) of every complete checkpoint name, oldest first."""
        found = [(int(m.group(1)), p) for p in glob.glob(os.path.join(self.ckpt, "ckpt-*.ddpck"))
                 for m in [re.search(r"ckpt-(\d+)\.ddpck$", p)] if m]
        return sorted(found)

    def newest(self):
        return max((step for step, _ in self.checkpoints()), default=-1)

    def wait_checkpoint(self, step, timeout=120):
        self.t.wait_for("%s: checkpoint of step %d" % (self.name, step),
                        lambda: self.newest() >= step, timeout)

    def wait_world2(self, timeout=60):
        self.t.wait_for("%s: both workers" % self.name,
                        lambda: worker_pid(self.mark, "127.0.0.2") and
                        worker_pid(self.mark, "127.0.0.3"), timeout)

    def accuracy(self):
        for n in self.nodes:
            m = re.findall(r"done: \d+ steps.*test accuracy ([0-9.]+)", n.stdout())
            if m:
                return float(m[-1])
        return None

    def expect(self, codes, accuracy=None):
        """Waits for every node (bounded), checks its exit code, that nothing is left, and the
        accuracy when one is expected."""
        for n, code in zip(self.nodes, codes):
            got = n.wait(120)
            check(got == code, "%s: %s exit code %s, expected %s" % (self.name, n.name, got, code))
        left = self.t.wait_for_value(lambda: marked(self.mark), 5)
        check(not left, "%s: nothing left running (%s)" % (self.name, left))
        if accuracy is not None:
            acc = self.accuracy()
            check(acc is not None, "%s: training completed with a test accuracy" % self.name)
            print("%s: accuracy %.4f (clean %.4f)" % (self.name, acc, accuracy), flush=True)
            check(abs(acc - accuracy) <= TOLERANCE, "%s: accuracy %.4f within %.3f of the "
                  "clean run's %.4f" % (self.name, acc, TOLERANCE, accuracy))


def stop_for(pid, seconds):
    stop(pid)
    time.sleep(seconds)
    os.kill(pid, signal.SIGCONT)


# Each fault: runs a job, injects it once a checkpoint of step `at` exists, checks the outcome.
def worker_kill(t, ref, at):
    j = Job(t, "worker_kill").start()
    j.wait_world2()
    j.wait_checkpoint(at)
    os.kill(worker_pid(j.mark, "127.0.0.3"), signal.SIGKILL)
    j.expect([0, 0], ref)
    check("failed: signal 9 (SIGKILL)" in j.b.stderr(), "worker_kill: b reports its killed worker")


def agent_kill_rejoin(t, ref, at):
    j = Job(t, "agent_kill_rejoin").start()
    j.wait_world2()
    j.wait_checkpoint(at)
    j.b.signal(signal.SIGKILL)
    t.wait_for("agent_kill_rejoin: a alone", lambda: "worker(s) of 1 (" in j.a.stderr(), 60)
    j.b2 = j.agent("b2", "127.0.0.3")  # b's node comes back
    j.expect([0, -signal.SIGKILL, 0], ref)


def agent_sigterm(t, ref, at):
    j = Job(t, "agent_sigterm").start()
    j.wait_world2()
    j.wait_checkpoint(at)
    j.b.signal(signal.SIGTERM)
    j.expect([0, 128 + signal.SIGTERM], ref)


def agent_sigstop(t, ref, at):
    j = Job(t, "agent_sigstop").start()
    j.wait_world2()
    j.wait_checkpoint(at)
    # a evicts b after 1.8 s (TRAINING_CONF) and goes on alone; b resumes as soon as a has
    # evicted it, while a still trains (b then learns it left the job and exits 0). A fixed stop
    # (3 s) let a fast machine finish the job, and end the store a hosts, before b resumed.
    stop(j.b.proc.pid)
    try:
        t.wait_for("agent_sigstop: a evicts the stopped b",
                   lambda: "was evicted: no heartbeat" in j.a.stderr(), 30)
    finally:
        os.kill(j.b.proc.pid, signal.SIGCONT)
    j.expect([0, 0], ref)
    check("was evicted: no heartbeat" in j.a.stderr(), "agent_sigstop: a evicted the stopped b")


def worker_sigstop(t, ref, at):
    # Stopped for 3 s, well under the peer timeout: only named, never killed.
    j = Job(t, "worker_sigstop").start(["--peer-timeout=20"])
    j.wait_world2()
    j.wait_checkpoint(at)
    pid = worker_pid(j.mark, "127.0.0.3")
    stop_for(pid, 3.0)
    j.expect([0, 0], ref)
    err = j.b.stderr()
    check(re.search(r"rank \d on node \d \([^,]+, local rank 0, pid %d\) has made no progress"
                    % pid, err), "worker_sigstop: b's agent names its stopped worker")


def worker_frozen(t, ref, at):
    # Stopped for good: its agent kills it after the peer timeout (its runtime's heartbeat
    # stopped), the job restarts from the checkpoint and finishes with the clean accuracy.
    j = Job(t, "worker_frozen").start(["--peer-timeout=1"])
    j.wait_world2()
    j.wait_checkpoint(at)
    pid = worker_pid(j.mark, "127.0.0.3")
    stop(pid)
    j.expect([0, 0], ref)
    err = j.b.stderr()
    m = re.search(r"rank \d \(local rank 0, pid %d\) on node \d stopped answering: no heartbeat "
                  r"for ([0-9.]+) s \(--peer-timeout=1\)" % pid, err)
    check(m and float(m.group(1)) >= 1.0, "worker_frozen: b's agent names its frozen worker")
    check("sent by ddprun: no heartbeat" in err, "worker_frozen: the kill is the root cause")
    check(not alive(pid), "worker_frozen: the frozen worker is gone")


def truncated_checkpoint(t, ref, at):
    j = Job(t, "truncated_checkpoint").start()
    j.wait_world2()
    j.wait_checkpoint(at)
    writer = worker_pid(j.mark, rank=0)  # rank 0 writes the checkpoints
    stop(writer)  # so that the torn file stays the newest
    newest = j.checkpoints()[-1][1]
    os.truncate(newest, os.path.getsize(newest) // 2)  # torn, as by a crash without rename
    os.kill(writer, signal.SIGKILL)
    j.expect([0, 0], ref)
    out = j.a.stderr() + j.b.stderr()
    check("skipping" in out, "truncated_checkpoint: the torn checkpoint was skipped, saying so")


def store_host_killed(t, ref, at):
    j = Job(t, "store_host_killed").start()
    j.wait_world2()
    j.wait_checkpoint(at)
    j.a.signal(signal.SIGKILL)
    j.expect([-signal.SIGKILL, 1])
    check("lost the rendezvous store" in j.b.stderr() or "127.0.0.2:%d" % j.port in j.b.stderr(),
          "store_host_killed: b names the lost store")


FAULTS = [worker_kill, agent_kill_rejoin, agent_sigterm, agent_sigstop, worker_sigstop,
          worker_frozen, truncated_checkpoint, store_host_killed]


def fault_series(t):
    if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        return skip_unless_ci("Fashion-MNIST is not installed in %s (dataset-fashion-mnist)" % DATA)
    seed = int(os.environ.get("DDPRUN_TEST_SEED", "0") or 0) or random.randrange(1, 10**6)
    print("fault_series: DDPRUN_TEST_SEED=%d" % seed, flush=True)
    rng = random.Random(seed)
    t0 = time.time()
    clean = Job(t, "clean").start()
    clean.expect([0, 0])
    ref = clean.accuracy()
    check(ref is not None and ref > 0.5, "the clean run trains (accuracy %s)" % ref)
    print("clean: accuracy %.4f in %.1f s" % (ref, time.time() - t0), flush=True)
    faults = FAULTS[:]
    rng.shuffle(faults)
    only = os.environ.get("DDPRUN_FAULTS")  # a comma-separated subset, to reproduce one
    if only:
        faults = [f for f in faults if f.__name__ in only.split(",")]
    for fault in faults:
        at = rng.choice([10, 20, 30, 40, 50, 60, 70, 80])  # of 256 steps at world 2
        t1 = time.time()
        print("%s at checkpoint %d ..." % (fault.__name__, at), flush=True)
        fault(t, ref, at)
        print("%s: ok in %.1f s" % (fault.__name__, time.time() - t1), flush=True)
    print("fault series: %d faults in %.1f s" % (len(faults), time.time() - t0))


SCENARIOS = {"fault_series": fault_series}

if __name__ == "__main__":
    sys.exit(run(SCENARIOS))
