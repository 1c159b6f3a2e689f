"""Whole jobs under `ddprun --timeline=FILE` with the real mnist_mlp (docs/timeline.md):
  two_ranks    the trace is valid Chrome-trace JSON with the agent's and both ranks' tracks,
               spans nest per thread, times are ordered per track, the set-up spans and every
               step carry minor_faults, ddprun-trace summarises it
  rank_killed  rank 1 SIGKILLed mid-run: the trace shows its death, the restart and the new
               process on the same track, and the job's end
  straggler    rank 1 stopped for 30 ms of every 50 ms (SIGSTOP/SIGCONT from outside):
               ddprun-trace names it the straggler
  two_nodes    two agents (127.0.0.2, 127.0.0.3; --nnodes=2, c10d) of one rank each, node b's
               timeline clock 5 s ahead (the test hook DDPRUN_TIMELINE_TEST_CLOCK_SKEW_US): one
               file with both agents and both ranks, the skew measured and removed (every
               allreduce overlaps on both ranks within the stated bound)
  two_nodes_etcd  the same with --rdzv-backend=etcd-v3 (a real etcd cluster started here;
               skipped without etcd, failed under CI=true)
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
    # The start events name the worker's pid (it is known once it exec'd), the one that exits.
    starts = {e["args"]["rank"]: e["args"]["pid"] for e in agent if e["name"] == "worker start"}
    exits = {e["args"]["rank"]: e["args"]["pid"] for e in agent if e["name"] == "worker exit"}
    check(all(p > 0 for p in starts.values()) and starts == exits,
          "worker start pids are the workers' (%s, exits %s)" % (starts, exits))
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
        # minor_faults (timeline::FaultCount): the set-up spans touch new pages (a run here:
        # 51-1232 each), every step says how many it touched, the first (gradients, optimizer
        # state: ~560) more than the median one (0).
        for name in ("communicator setup", "ddp setup", "lend buffer"):
            faults = [e["args"].get("minor_faults") for e in evs if e["name"] == name]
            check(faults and all(isinstance(f, int) and f > 0 for f in faults),
                  "rank %d: %r spans count the pages they touched (%s)" % (rank, name, faults))
        faults = [e["args"].get("minor_faults") for e in steps]
        check(all(isinstance(f, int) and f >= 0 for f in faults),
              "rank %d: every step has minor_faults (%s)" % (rank, faults))
        check(faults[0] > sorted(faults)[len(faults) // 2],
              "rank %d: the first step touched more new pages than the median step (%s)" %
              (rank, faults))
    out = ddprun_trace(job.trace)
    print(out)
    check("2 rank(s), 1 agent(s)" in out, "ddprun-trace counts the tracks")
    check(re.search(r"^straggler: ", out, re.M), "ddprun-trace ends with a straggler line")
    summary = json.loads(ddprun_trace(job.trace, "--json"))
    check([r["steps"] for r in summary["ranks"]] == [32, 32], "--json: 32 steps per rank")
    check(summary["compared_collectives"] > 32, "--json: collectives matched across ranks")
    # mnist_mlp recovers in process by default: it commits after every step, which the summary
    # counts apart from the steps.
    check(all(r["commits"] >= 32 and r["commit_us"] > 0 for r in summary["ranks"]),
          "--json: each rank's in-process recovery commits, counted and timed")


def rank_killed(tmp):
    ckpt = os.path.join(tmp, "ckpt")
    job = Job(tmp, "rank_killed", ["--train-limit", "4096", "--test-limit", "500", "--epochs", "1",
                                   "--batch-size", "16", "--checkpoint-dir", ckpt,
                                   "--checkpoint-interval", "20"], extra=["--max-restarts=1", "--recovery=restart"])
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
    # Rank 1 runs 40% of the time (stopped 30 ms of every 50 ms), so most of its steps' compute
    # is slow and it arrives last at most collectives. Long stops far apart (150 ms every 400
    # ms) could all land inside collectives, where a stop shows as both ranks' wait in the
    # collective, not as a late arrival: a fresh-clone CI saw 4 of 4 land there and the trace
    # named rank 0 (it leaves such a collective last).
    job = Job(tmp, "straggler", ["--train-limit", "24576", "--test-limit", "500", "--epochs", "1",
                                 "--batch-size", "16"])
    victim = worker_pid(job.mark, 1)
    stop = threading.Event()

    def slow_down():
        while not stop.is_set():
            time.sleep(0.02)
            try:
                os.kill(victim, signal.SIGSTOP)
                time.sleep(0.03)
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


def free_port(addr):
    import socket
    with socket.socket() as sock:
        sock.bind((addr, 0))
        return sock.getsockname()[1]


SKEW_US = 5_000_000


def two_nodes(tmp):
    port = free_port("127.0.0.2")
    conf = "heartbeat=0.3,missed_heartbeats=3,last_call_timeout=0.5,join_timeout=60," \
           "read_timeout=3,close_timeout=10,exit_barrier_timeout=60"
    two_nodes_on(tmp, ["--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.2:%d" % port,
                       "--rdzv-id=tl2", "--rdzv-conf=" + conf])


def two_nodes_etcd(tmp):
    """two_nodes with --rdzv-backend=etcd-v3 (a real 3-member etcd started here): the nodes
    share no store of their own, so the other node pings and ships through the workers' store
    node rank 0's agent hosts (docs/timeline.md)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "multinode"))
    from etcd_cluster import EtcdCluster, installed
    if not installed():
        if os.environ.get("CI") == "true":
            raise Failure("etcd is not installed, and CI=true: scripts/setup installs it")
        print("SKIP: etcd is not installed (etcd-server)")
        return SKIP
    os.makedirs(os.path.join(tmp, "etcd"))
    etcd = EtcdCluster(os.path.join(tmp, "etcd"))
    try:
        conf = "lease_ttl=5,read_timeout=10,last_call_timeout=0.5,join_timeout=60," \
               "close_timeout=5,exit_barrier_timeout=60"
        two_nodes_on(tmp, ["--rdzv-backend=etcd-v3", "--rdzv-endpoint=" + etcd.endpoints(),
                           "--rdzv-id=tl2etcd", "--rdzv-conf=" + conf])
    finally:
        etcd.stop()


def two_nodes_on(tmp, rdzv):
    trace_path = os.path.join(tmp, "job.json")  # one path for both agents: one machine here
    procs = {}
    for name, addr, skew in (("a", "127.0.0.2", 0), ("b", "127.0.0.3", SKEW_US)):
        cmd = [os.path.join(BIN, "ddprun"), "--nnodes=2", "--nproc-per-node=1"] + rdzv + \
              ["--local-addr=" + addr, "--timeline=" + trace_path,
               os.path.join(BIN, "mnist_mlp"), "--data", DATA, "--log-interval", "1000",
               "--train-limit", "1024", "--test-limit", "200", "--epochs", "1",
               "--batch-size", "16"]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if skew:
            env["DDPRUN_TIMELINE_TEST_CLOCK_SKEW_US"] = str(skew)
        log = os.path.join(tmp, name + ".log")
        procs[name] = (subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                        env=env, start_new_session=True), log)
    codes = {}
    for name, (p, log) in procs.items():
        try:
            codes[name] = p.wait(timeout=170)
        except subprocess.TimeoutExpired:
            for q, _ in procs.values():
                try:
                    os.killpg(q.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            raise Failure("node %s did not end within 170 s" % name)
    logs = {n: open(l).read() for n, (_, l) in procs.items()}
    for name in procs:
        check(codes[name] == 0, "node %s exits 0:\n%s" % (name, logs[name]))

    check(os.path.exists(trace_path), "the timeline %s was written" % trace_path)
    with open(trace_path) as f:
        trace = json.load(f)
    check_well_formed(trace)
    names = sorted(tracks(trace).values())
    check(names == ["agent 127.0.0.2", "agent 127.0.0.3", "rank 0", "rank 1"],
          "one file with both agents and both ranks (%s)" % names)
    other = trace["otherData"]
    bound = other.get("clock_offset_bound_us")
    check(isinstance(bound, int) and bound > 0, "the file states the offset's bound (%r)" % bound)
    check(bound < SKEW_US // 10, "the bound (%d us) is far below the skew" % bound)
    check(other.get("nodes_missing") == [], "no node missing: %s" % other.get("nodes_missing"))
    info = {t["track"]: t for t in other["tracks"]}
    check(sorted(info) == names, "otherData.tracks names every track: %s" % sorted(info))
    ref = [n for n, t in info.items() if t["clock_offset_us"] == 0 and t["clock_offset_bound_us"] == 0]
    moved = [n for n in names if n not in ref]
    check(len(ref) == 2 and len(moved) == 2, "the writer's node (2 tracks) is the reference, the "
          "other's 2 tracks are shifted: %s" % info)
    writer_is_a = "agent 127.0.0.2" in ref
    # The other node's clock is ahead by SKEW_US (b's) or behind by it (a's, b writing).
    expect = -SKEW_US if writer_is_a else SKEW_US
    for n in moved:
        t = info[n]
        check(abs(t["clock_offset_us"] - expect) <= t["clock_offset_bound_us"],
              "%s: the offset %d us is the injected %d us within its bound %d us" %
              (n, t["clock_offset_us"], expect, t["clock_offset_bound_us"]))

    # The part files hold each node's own clock: the skew is there before the merge.
    def first_collective(rank):
        parts = os.path.join(trace_path + ".parts")
        for d in os.listdir(parts):
            for fn in os.listdir(os.path.join(parts, d)):
                if fn.startswith("rank-%d-" % rank):
                    with open(os.path.join(parts, d, fn)) as f:
                        for line in f:
                            e = json.loads(line)
                            if e.get("cat") == "collective" and e["args"].get("seq") == 3:
                                return e
        raise Failure("rank %d's part file has no collective seq 3" % rank)
    raw0, raw1 = first_collective(0), first_collective(1)
    raw_gap = abs(raw0["ts"] - raw1["ts"])
    check(raw_gap > SKEW_US // 2, "the raw part files are %d us apart (the hook works)" % raw_gap)

    # On the merged axis, one allreduce cannot end on a rank before the other rank called it
    # (a broadcast's root can: its send may complete first, so only allreduces are compared).
    calls = {}
    for rank in (0, 1):
        for e in by_track(trace, "rank %d" % rank):
            if e.get("cat") == "collective" and e["name"] == "allreduce":
                calls.setdefault((e["args"]["group"], e["args"]["seq"]), {})[rank] = e
    both = [c for c in calls.values() if len(c) == 2]
    check(len(both) > 30, "allreduces of both ranks matched by (group, seq): %d" % len(both))
    # the largest (latest call - earliest completion); negative: every one overlapped by that
    worst = max(max(e["ts"] for e in c.values()) - min(e["ts"] + e["dur"] for e in c.values())
                for c in both)
    check(worst <= bound, "every allreduce overlaps on both ranks within the bound: the worst "
          "gap is %d us, the bound %d us" % (worst, bound))
    print("two nodes: %d allreduces overlap (worst gap %d us), offset bound %d us, "
          "skew %d us removed" % (len(both), worst, bound, SKEW_US))
    out = ddprun_trace(trace_path)
    print(out)
    check("2 rank(s), 2 agent(s)" in out, "ddprun-trace counts both agents and both ranks")
    check("within +-%d us" % bound in out, "ddprun-trace states the clock bound")
    summary = json.loads(ddprun_trace(trace_path, "--json"))
    check(summary["compared_collectives"] > 30, "--json: collectives matched across nodes")
    check(summary["clock_offset_bound_us"] == bound, "--json: the clock bound")


SCENARIOS = {"two_ranks": two_ranks, "rank_killed": rank_killed, "straggler": straggler,
             "two_nodes": two_nodes, "two_nodes_etcd": two_nodes_etcd}

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
        if SCENARIOS[name](tmp) == SKIP:
            shutil.rmtree(tmp, ignore_errors=True)
            sys.exit(SKIP)
        print("PASS: %s" % name)
        shutil.rmtree(tmp, ignore_errors=True)
        sys.exit(0)
    except (Failure, ValueError, KeyError) as e:
        print("FAIL: %s: %s (files kept in %s)" % (name, e, tmp))
        sys.exit(1)
