"""Elastic membership changes that must not lose or repeat data: real ddprun agents on loopback
addresses (127.0.0.2, ...), workers that use the real DistributedSampler and checkpoints
(sample_worker.cpp) and record the sample ids they use. Usage: elastic_scenarios.py NAME.

exactly_once_1_2_1 / exactly_once_2_3_2: the world grows and shrinks (a node joins, an agent is
SIGKILLed) and a worker is SIGKILLed, each at a random step (seeded: DDPRUN_TEST_SEED, printed);
every sample id must be used exactly once per epoch by the steps that count -- a step redone
after a resume replaces the one that was lost -- and nothing may be left running.
"""
import glob
import os
import random
import signal
import sys
import time

import harness
from harness import TRAINING_CONF, check, pid_alive, run

SAMPLE_WORKER = os.path.join(harness.BIN, "sample_worker")
SAMPLES, EPOCHS = 1200, 2


def seeded(name):
    seed = int(os.environ.get("DDPRUN_TEST_SEED", "0") or 0) or random.randrange(1, 10**6)
    print("%s: DDPRUN_TEST_SEED=%d" % (name, seed), flush=True)
    return random.Random(seed)


class SampleJob:
    """One elastic job of sample_worker agents; its records under <dir>/samples."""

    def __init__(self, t, rdzv_id, nnodes):
        self.t, self.rdzv_id, self.nnodes = t, rdzv_id, nnodes
        self.out = os.path.join(t.dir, "samples")
        self.ckpt = os.path.join(t.dir, "ckpt")
        self.nodes = {}

    def agent(self, name, addr):
        args = ["--nnodes=%s" % self.nnodes, "--nproc-per-node=1", "--rdzv-backend=c10d",
                "--rdzv-endpoint=%s" % self.t.endpoint(), "--rdzv-id=%s" % self.rdzv_id,
                "--local-addr=%s" % addr, "--rdzv-conf=%s" % TRAINING_CONF, "--max-restarts=10",
                SAMPLE_WORKER, "--out", self.out, "--ckpt", self.ckpt,
                "--samples", str(SAMPLES), "--epochs", str(EPOCHS), "--step-ms", "15"]
        node = harness.Node(self.t, name, args)
        self.nodes[name] = node
        return node

    def logs(self):
        """pid -> (start line fields, [(step, epoch, [(id, position)])]), complete lines only."""
        out = {}
        for path in glob.glob(os.path.join(self.out, "rank-*.log")):
            pid = int(os.path.basename(path)[5:-4])
            with open(path) as f:
                text = f.read()
            lines = text.split("\n")[:-1]  # the last piece is empty or a partial line
            start, steps = None, []
            for line in lines:
                w = line.split()
                if w[0] == "start":
                    start = {"token": w[1], "resumed": int(w[2]), "world": int(w[3]),
                             "rank": int(w[4]), "time": int(w[5])}
                elif w[0] == "step":
                    steps.append((int(w[1]), int(w[2]),
                                  [tuple(int(x) for x in p.split(":")) for p in w[4:]]))
            if start:
                out[pid] = (start, steps)
        return out

    def max_step(self):
        return max((s[0] for _, steps in self.logs().values() for s in steps), default=0)

    def worker_pids(self):
        return list(self.logs())

    def rounds(self):
        """Rounds in the order they ran: (token, world, resumed-from, [pids])."""
        by = {}
        for pid, (start, steps) in self.logs().items():
            first = min([s[0] for s in steps], default=10**9)
            r = by.setdefault(start["token"], {"world": start["world"], "resumed": start["resumed"],
                                               "pids": [], "first": first, "time": start["time"]})
            r["pids"].append(pid)
            r["first"] = min(r["first"], first)
            r["time"] = min(r["time"], start["time"])
            check(r["resumed"] == start["resumed"] and r["world"] == start["world"],
                  "every rank of a round resumed from the same checkpoint: %s" % start)
        # Rounds run one after the other: a round's workers start after the round before ended.
        return sorted(by.items(), key=lambda kv: kv[1]["time"])

    def wait_steps(self, target, timeout=90):
        self.t.wait_for("step %d" % target, lambda: self.max_step() >= target, timeout)

    def wait_world(self, world, timeout=60):
        """Waits for a round of `world` that has made a step; returns its step then."""
        def ready():
            for token, r in self.rounds():
                if r["world"] == world and len(r["pids"]) == world and r["first"] < 10**9:
                    return r
            return None
        return self.t.wait_for("a round of %d making steps" % world, ready, timeout)

    def current_pids(self):
        return [p for p in self.worker_pids() if pid_alive(p)]

    def check_exactly_once(self):
        """Replays the rounds: a round resumed from step S replaces every record of a step > S
        (those steps were lost and are done again); what remains must use every id of every
        epoch exactly once (positions >= SAMPLES are the sampler's padding of the last segment
        of an epoch, as PyTorch pads)."""
        logs = self.logs()
        kept = {}  # step -> list of (epoch, [(id, position)]) from every rank
        order = []
        for token, r in self.rounds():
            order.append("%d@%d" % (r["world"], r["resumed"]))
            for step in [s for s in kept if s > r["resumed"]]:
                del kept[step]
            for pid in r["pids"]:
                for step, epoch, ids in logs[pid][1]:
                    kept.setdefault(step, []).append((epoch, ids))
        print("rounds (world@resumed-from-step):", " ".join(order))
        steps = sorted(kept)
        check(steps == list(range(1, len(steps) + 1)), "the kept steps are 1..%d without a gap"
              % len(steps))
        for epoch in range(EPOCHS):
            ids, positions = [], []
            for s in steps:
                for e, pairs in kept[s]:
                    if e == epoch:
                        ids += [i for i, p in pairs if p < SAMPLES]
                        positions += [p for i, p in pairs if p < SAMPLES]
            check(sorted(positions) == list(range(SAMPLES)),
                  "epoch %d: every position once (%d positions, %d distinct)"
                  % (epoch, len(positions), len(set(positions))))
            missing = set(range(SAMPLES)) - set(ids)
            twice = len(ids) - len(set(ids))
            check(not missing and twice == 0 and len(ids) == SAMPLES,
                  "epoch %d: every id exactly once (%d missing, %d repeated)"
                  % (epoch, len(missing), twice))
        return order


def kill_a_worker(job, rng):
    pids = job.current_pids()
    check(pids, "a worker to kill")
    victim = rng.choice(pids)
    os.kill(victim, signal.SIGKILL)
    print("SIGKILLed worker pid %d at step ~%d" % (victim, job.max_step()), flush=True)


def finish_and_check(job, t, survivors, killed_agents):
    for n in survivors:
        check(n.wait(120) == 0, "node %s exit code %s" % (n.name, n.proc.returncode))
    for n in killed_agents:
        n.wait(10)
    left = [p for p in job.worker_pids() if pid_alive(p)]
    check(not left, "no worker left running (%s)" % left)
    return job.check_exactly_once()


def exactly_once_1_2_1(t):
    """World 1, then 2 (a node joins), a worker SIGKILLed, then 1 (the new node's agent is
    SIGKILLed), each at a random step."""
    rng = seeded("exactly_once_1_2_1")
    job = SampleJob(t, "once121", "1:2")
    a = job.agent("a", "127.0.0.2")
    job.wait_world(1)
    job.wait_steps(rng.randint(5, 40))
    b = job.agent("b", "127.0.0.3")
    job.wait_world(2)
    job.wait_steps(job.max_step() + rng.randint(3, 30))
    kill_a_worker(job, rng)
    job.wait_steps(job.max_step() + rng.randint(3, 30))
    print("SIGKILL agent b at step ~%d" % job.max_step(), flush=True)
    b.signal(signal.SIGKILL)
    order = finish_and_check(job, t, [a], [b])
    worlds = [int(o.split("@")[0]) for o in order]
    check(worlds[0] == 1 and 2 in worlds and worlds[-1] == 1, "worlds 1 -> 2 -> 1: %s" % worlds)


def exactly_once_2_3_2(t):
    """World 2, then 3 (a node joins), a worker SIGKILLed, then 2 (the new node's agent is
    SIGKILLed), each at a random step."""
    rng = seeded("exactly_once_2_3_2")
    job = SampleJob(t, "once232", "2:3")
    a = job.agent("a", "127.0.0.2")
    b = job.agent("b", "127.0.0.3")
    job.wait_world(2)
    job.wait_steps(rng.randint(5, 40))
    c = job.agent("c", "127.0.0.4")
    job.wait_world(3)
    job.wait_steps(job.max_step() + rng.randint(3, 30))
    kill_a_worker(job, rng)
    job.wait_steps(job.max_step() + rng.randint(3, 30))
    print("SIGKILL agent c at step ~%d" % job.max_step(), flush=True)
    c.signal(signal.SIGKILL)
    order = finish_and_check(job, t, [a, b], [c])
    worlds = [int(o.split("@")[0]) for o in order]
    check(worlds[0] == 2 and 3 in worlds and worlds[-1] == 2, "worlds 2 -> 3 -> 2: %s" % worlds)


SCENARIOS = {f.__name__: f for f in (exactly_once_1_2_1, exactly_once_2_3_2)}

if __name__ == "__main__":
    sys.exit(run(SCENARIOS))
