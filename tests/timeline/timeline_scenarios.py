"""Whole jobs under `ddprun --timeline=FILE` with the real mnist_mlp (docs/timeline.md):
  two_ranks    the trace is valid Chrome-trace JSON with the agent's and both ranks' tracks,
               spans nest per thread, times are ordered per track, ddprun-trace summarises it
  rank_killed  rank 1 SIGKILLed mid-run: the trace shows its death, the restart and the new
               process on the same track, and the job's end
  straggler    rank 1 stopped for 150 ms every 250 ms (SIGSTOP/SIGCONT from outside):
               ddprun-trace names it the straggler
Usage: timeline_scenarios.py SCENARIO   (exit 0 pass, 1 fail, 77 skip)
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

BIN = os.environ.get("DDPRUN_BIN", os.path.join(os.path.dirname(__file__), "../../build/bin"))
DATA = "/usr/share/datasets/fashion-mnist"
SKIP = 77


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


def worker_pid(mark, rank, timeout=60):
    """The mnist_mlp process of global `rank` in the job whose environment carries `mark`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open("/proc/%s/comm" % d) as f:
                    if f.read().strip() != "mnist_mlp":
                        continue
                with open("/proc/%s/environ" % d, "rb") as f:
                    env = f.read().split(b"\0")
                if mark.encode() in env and ("RANK=%d" % rank).encode() in env:
                    return int(d)
            except OSError:
                pass
        time.sleep(0.02)
    raise Failure("no mnist_mlp of rank %d started within %d s" % (rank, timeout))


class Job:
    def __init__(self, tmp, name, train_args, extra=()):
        self.trace = os.path.join(tmp, name + ".json")
        self.mark = "DDPRUN_TEST_MARK=%s-%d" % (name, os.getpid())
        self.out_path = os.path.join(tmp, name + ".log")
        cmd = [os.path.join(BIN, "ddprun"), "--standalone", "--nproc-per-node=2",
               "--timeline=" + self.trace] + list(extra) + \
              [os.path.join(BIN, "mnist_mlp"), "--data", DATA, "--log-interval", "1000"] + train_args
        env = dict(os.environ, OMP_NUM_THREADS="1", DDPRUN_TEST_MARK=self.mark.split("=", 1)[1])
        self.proc = subprocess.Popen(cmd, stdout=open(self.out_path, "w"), stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)

    def wait(self, timeout=150):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise Failure("ddprun did not end within %d s" % timeout)

    def output(self):
        with open(self.out_path) as f:
            return f.read()

    def load(self):
        check(os.path.exists(self.trace), "the timeline %s was written" % self.trace)
        with open(self.trace) as f:
            return json.load(f)  # valid JSON, or this raises


def tracks(trace):
    return {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
            if e.get("ph") == "M" and e.get("name") == "process_name"}


def by_track(trace, name):
    pid = {v: k for k, v in tracks(trace).items()}.get(name)
    return [e for e in trace["traceEvents"] if e.get("pid") == pid and e.get("ph") != "M"]


def check_well_formed(trace):
    """Every event has the format's fields; per track and thread, starts are ordered and spans
    nest (each span ends within the span that encloses its start)."""
    events = trace["traceEvents"]
    check(isinstance(events, list) and events, "traceEvents is a non-empty list")
    for e in events:
        for field in ("name", "ph", "pid"):
            check(field in e, "every event has %r: %s" % (field, e))
        if e["ph"] in ("X", "i"):
            check(isinstance(e.get("ts"), int) and "tid" in e, "timed event has ts, tid: %s" % e)
        if e["ph"] == "X":
            check(isinstance(e.get("dur"), int) and e["dur"] >= 0, "span has dur >= 0: %s" % e)
    threads = {}
    for e in events:
        if e["ph"] in ("X", "i"):
            threads.setdefault((e["pid"], e["tid"]), []).append(e)
    for key, evs in threads.items():
        starts = [e["ts"] for e in evs]
        check(starts == sorted(starts), "times ordered on track/thread %s" % (key,))
        stack = []
        for e in evs:
            if e["ph"] != "X":
                continue
            while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"]:
                stack.pop()
            if stack:
                parent = stack[-1]
                check(e["ts"] + e["dur"] <= parent["ts"] + parent["dur"],
                      "span %s [%d, +%d] closes inside %s [%d, +%d] on %s" %
                      (e["name"], e["ts"], e["dur"], parent["name"], parent["ts"], parent["dur"], key))
            stack.append(e)


def ddprun_trace(path, *args):
    r = subprocess.run([os.path.join(BIN, "ddprun-trace"), path] + list(args),
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, "ddprun-trace exit %d: %s" % (r.returncode, r.stderr))
    return r.stdout


def two_ranks(tmp):
    job = Job(tmp, "two_ranks", ["--train-limit", "2048", "--test-limit", "500", "--epochs", "1",
                                 "--batch-size", "32"])
    check(job.wait() == 0, "the job succeeds:\n" + job.output())
    trace = job.load()
    check_well_formed(trace)
    names = sorted(tracks(trace).values())
    check(len(names) == 3 and names[0].startswith("agent ") and names[1:] == ["rank 0", "rank 1"],
          "tracks: one agent and both ranks (%s)" % names)
    agent = by_track(trace, names[0])
    kinds = [e["name"] for e in agent]
    for want, count in (("rendezvous", 1), ("worker start", 2), ("worker exit", 2), ("job end", 1)):
        check(kinds.count(want) == count, "agent: %d %r event(s) (%s)" % (count, want, kinds))
    for rank in (0, 1):
        evs = by_track(trace, "rank %d" % rank)
        steps = [e for e in evs if e["name"] == "step" and e["cat"] == "trainer"]
        colls = [e for e in evs if e.get("cat") == "collective"]
        check(len(steps) == 32, "rank %d: 32 step spans (%d)" % (rank, len(steps)))
        check(any(e["name"] == "store connect" for e in evs), "rank %d: store connect" % rank)
        check(any(e["name"] == "communicator setup" for e in evs), "rank %d: setup" % rank)
        check(any(e["name"] == "ddp gradient sync" for e in evs), "rank %d: DDP sync" % rank)
        check(colls and all("seq" in e["args"] and e["args"]["bytes"] >= 0 for e in colls),
              "rank %d: collectives with seq and bytes" % rank)
        check(any(e["name"] == "allreduce" and e["args"]["bytes"] > 1000000 for e in colls),
              "rank %d: the gradient allreduce (1.6 MB) is there" % rank)
    out = ddprun_trace(job.trace)
    print(out)
    check("2 rank(s), 1 agent(s)" in out, "ddprun-trace counts the tracks")
    check(re.search(r"^straggler: ", out, re.M), "ddprun-trace ends with a straggler line")
    summary = json.loads(ddprun_trace(job.trace, "--json"))
    check([r["steps"] for r in summary["ranks"]] == [32, 32], "--json: 32 steps per rank")
    check(summary["compared_collectives"] > 32, "--json: collectives matched across ranks")


def rank_killed(tmp):
    ckpt = os.path.join(tmp, "ckpt")
    job = Job(tmp, "rank_killed", ["--train-limit", "4096", "--test-limit", "500", "--epochs", "1",
                                   "--batch-size", "16", "--checkpoint-dir", ckpt,
                                   "--checkpoint-interval", "20"], extra=["--max-restarts=1"])
    victim = worker_pid(job.mark, 1)
    deadline = time.time() + 60
    while not (os.path.isdir(ckpt) and any(n.endswith(".ddpck") for n in os.listdir(ckpt))):
        check(time.time() < deadline, "a checkpoint within 60 s")
        time.sleep(0.02)
    os.kill(victim, signal.SIGKILL)
    check(job.wait() == 0, "the job recovers and succeeds:\n" + job.output())
    trace = job.load()
    check_well_formed(trace)
    agent = by_track(trace, [n for n in tracks(trace).values() if n.startswith("agent")][0])
    exits = [e for e in agent if e["name"] == "worker exit" and e["args"]["failed"] == 1]
    check(len(exits) == 1 and exits[0]["args"]["pid"] == victim and
          "SIGKILL" in exits[0]["args"]["result"], "the death of pid %d is there: %s" % (victim, exits))
    restarts = [e for e in agent if e["name"] == "restart"]
    check(len(restarts) == 1 and "rank 1 failed" in restarts[0]["args"]["cause"],
          "one restart naming rank 1: %s" % restarts)
    check(restarts[0]["ts"] >= exits[0]["ts"], "the restart follows the death")
    starts = [e for e in agent if e["name"] == "worker start" and e["args"]["rank"] == 1]
    check(len(starts) == 2 and starts[1]["ts"] > restarts[0]["ts"],
          "rank 1 started again after the restart: %s" % starts)
    rank1 = by_track(trace, "rank 1")
    check(len({e["tid"] for e in rank1 if e["name"] == "store connect"}) == 2,
          "rank 1's track holds both of its processes")
    check(any(e["name"] == "checkpoint load" for e in rank1), "the resume's load is on it")
    out = ddprun_trace(job.trace)
    print(out)
    check("failed: signal 9 (SIGKILL)" in out and "restart: rank 1 failed" in out,
          "ddprun-trace lists the death and the restart")


def straggler(tmp):
    job = Job(tmp, "straggler", ["--train-limit", "6144", "--test-limit", "500", "--epochs", "1",
                                 "--batch-size", "16"])
    victim = worker_pid(job.mark, 1)
    stop = threading.Event()

    def slow_down():
        while not stop.is_set():
            time.sleep(0.25)
            try:
                os.kill(victim, signal.SIGSTOP)
                time.sleep(0.15)
                os.kill(victim, signal.SIGCONT)
            except ProcessLookupError:
                return

    t = threading.Thread(target=slow_down, daemon=True)
    t.start()
    code = job.wait()
    stop.set()
    t.join()
    check(code == 0, "the job succeeds:\n" + job.output())
    check_well_formed(job.load())
    out = ddprun_trace(job.trace)
    print(out)
    check(re.search(r"^straggler: rank 1 ", out, re.M), "ddprun-trace names rank 1 the straggler")


SCENARIOS = {"two_ranks": two_ranks, "rank_killed": rank_killed, "straggler": straggler}

if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    if name not in SCENARIOS:
        print("usage: %s {%s}" % (sys.argv[0], ",".join(SCENARIOS)))
        sys.exit(2)
    if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        if os.environ.get("CI") == "true":
            print("FAIL: Fashion-MNIST is not in %s, and CI=true: scripts/setup installs it" % DATA)
            sys.exit(1)
        print("SKIP: Fashion-MNIST is not in %s (dataset-fashion-mnist)" % DATA)
        sys.exit(SKIP)
    tmp = tempfile.mkdtemp(prefix="ddprun-timeline-%s-" % name)
    try:
        SCENARIOS[name](tmp)
        print("PASS: %s" % name)
        shutil.rmtree(tmp, ignore_errors=True)
        sys.exit(0)
    except (Failure, ValueError, KeyError) as e:
        print("FAIL: %s: %s (files kept in %s)" % (name, e, tmp))
        sys.exit(1)
