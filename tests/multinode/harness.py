"""Helpers for the multi-node tests: ddprun agents as "nodes" on loopback addresses.

Each agent is a real `ddprun` process started with --local-addr=127.0.0.N, so it advertises
its own address, exactly as on separate machines; only the kernel is shared. Output goes to
files under a temporary directory, which is printed (and kept) when a check fails.
"""
import contextlib
import ctypes
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

BIN = os.environ.get("DDPRUN_BIN", os.path.join(os.path.dirname(__file__), "../../build/bin"))
DDPRUN = os.path.join(BIN, "ddprun")
HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "worker.py")
SKIP = 77

# Short timeouts keep the suite fast: a dead node is evicted after 3 x 0.3 s.
FAST_CONF = "heartbeat=0.3,missed_heartbeats=3,last_call_timeout=0.5,join_timeout=30," \
            "read_timeout=3,close_timeout=5,exit_barrier_timeout=30"
# For scenarios that train with LibTorch workers: FAST_CONF with a keep-alive bound of 1.8 s
# (6 beats) instead of 0.9 s. Workers loading LibTorch on two cores, next to other work, held an
# agent's heartbeat up past 0.9 s: in fault_series an agent declared the store lost during a
# restart's start-up (exit 1 where 0 was expected) while the store host was alive and serving.
TRAINING_CONF = FAST_CONF.replace("missed_heartbeats=3", "missed_heartbeats=6")


class Failure(Exception):
    pass


def named_the_call(node, endpoint, silence):
    """The line `node`'s heartbeat wrote when it declared the store at `endpoint` lost, after
    `silence` s without a reply, names the call that failed and how long the beat waited for it
    ("...; the beat's call that failed, after S s: store at ENDPOINT: ADD 'KEY': ..."): S within
    the silence, and the call's error naming the store."""
    m = re.search(r"lost the rendezvous store at %s: it stopped answering: no reply to this "
                  r"node's heartbeat for [0-9.]+ s \(the keep-alive bound is [^)]*\); the beat's "
                  r"call that failed, after ([0-9.]+) s: (.+)$" % re.escape(endpoint),
                  node.stderr(), re.M)
    check(m, "%s names the heartbeat's call that failed: %s" % (node.name, node.stderr()[-800:]))
    print("%s: the beat's call that failed, after %s s: %s" % (node.name, m.group(1), m.group(2)))
    check(float(m.group(1)) <= silence + 0.05 and endpoint in m.group(2),
          "%s: a wait within the %.1f s of silence, a call naming the store: %s"
          % (node.name, silence, m.group(0)))


def stopped_answering(node, endpoint):
    """`node` failed naming `endpoint` as a store that stopped answering its heartbeat: the
    silence it measured is at least the keep-alive bound of FAST_CONF (0.3 s x 3), it does not
    doubt what the store is ("is it a ddprun-store?"), the line names the beat's call that failed
    (named_the_call), and it says so once."""
    err = node.stderr()
    m = re.search(r"lost the rendezvous store at %s: it stopped answering: no reply to this "
                  r"node's heartbeat for ([0-9.]+) s \(the keep-alive bound is 0.9 s" %
                  re.escape(endpoint), err)
    check(m, "%s says the store at %s stopped answering: %s" % (node.name, endpoint, err[-800:]))
    check(float(m.group(1)) >= 0.9, "%s measured %s s of silence, at least the bound" %
          (node.name, m.group(1)))
    check("is it a ddprun-store" not in err,
          "%s does not doubt what the store is: %s" % (node.name, err[-800:]))
    named_the_call(node, endpoint, float(m.group(1)))
    check(err.count("it stopped answering: no reply to this node's heartbeat") == 1,
          "%s says it once: %s" % (node.name, err[-800:]))


def skip_unless_ci(why):
    """SKIP for something scripts/setup installs (python3-torch); under CI=true (.ci/run) its
    absence means a broken set-up, so the scenario fails instead."""
    if os.environ.get("CI") == "true":
        raise Failure("%s, and CI=true: scripts/setup installs it" % why)
    print("SKIP: " + why)
    return SKIP


def check(cond, what):
    if not cond:
        raise Failure(what)


def pid_alive(pid):
    """Whether process `pid` exists and is not a zombie (a zombie is dead for our purpose)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        # Gone before the open (no such file) or between the open and the read (ESRCH).
        return False


def foreign_listener(reply, backlog, accepts=None):
    """A listener on 127.0.0.1 that is no ddprun store: it answers each connection with the
    bytes `reply` and closes it, for `accepts` connections (None: until the socket is closed), on
    a daemon thread. Returns the listening socket."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(backlog)

    def serve():
        served = 0
        while accepts is None or served < accepts:
            served += 1
            try:
                c, _ = srv.accept()
            except OSError:
                return
            c.sendall(reply)
            c.close()
    threading.Thread(target=serve, daemon=True).start()
    return srv


def exit_times(nodes, timeout):
    """Waits for every node of `nodes` at once (a thread each, each wait bounded by `timeout`);
    returns the time each exited, by name."""
    exited = {}

    def reap(n):
        n.wait(timeout)
        exited[n.name] = time.time()
    waiters = [threading.Thread(target=reap, args=(n,)) for n in nodes]
    for w in waiters:
        w.start()
    for w in waiters:
        w.join()
    return exited


def free_port(addr="127.0.0.1"):
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def thread_state(pid, tid):
    """The one-letter state of thread `tid` of process `pid` (/proc/PID/task/TID/stat)."""
    with open("/proc/%d/task/%d/stat" % (pid, tid)) as f:
        return f.read().split(")")[-1].split()[0]


class PtraceRefused(Exception):
    pass


@contextlib.contextmanager
def stopped_thread(tid):
    """Stops ONE thread (not its process: SIGSTOP would stop them all) while the block runs:
    ptrace PTRACE_SEIZE + PTRACE_INTERRUPT on that thread id, PTRACE_DETACH after. Raises
    PtraceRefused when the kernel does not allow it (Yama ptrace_scope 3, a container without
    CAP_SYS_PTRACE: the agents are this test's descendants, which scope 1 allows)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    PTRACE_DETACH, PTRACE_SEIZE, PTRACE_INTERRUPT = 17, 0x4206, 0x4207
    if libc.ptrace(PTRACE_SEIZE, tid, None, None) != 0:
        raise PtraceRefused("ptrace(PTRACE_SEIZE, %d): %s" % (tid, os.strerror(ctypes.get_errno())))
    try:
        check(libc.ptrace(PTRACE_INTERRUPT, tid, None, None) == 0,
              "ptrace(PTRACE_INTERRUPT, %d): %s" % (tid, os.strerror(ctypes.get_errno())))
        os.waitpid(tid, 0x40000000)  # __WALL: until the thread is in its ptrace stop
        yield
    finally:
        libc.ptrace(PTRACE_DETACH, tid, None, None)


class Node:
    """One ddprun agent: a process with its stdout/stderr in files."""

    def __init__(self, test, name, args, env=None, prefix=()):
        self.name = name
        self.out_path = os.path.join(test.dir, name + ".out")
        self.err_path = os.path.join(test.dir, name + ".err")
        self.cmd = list(prefix) + [DDPRUN] + args
        e = dict(os.environ, PYTHON_EXEC=sys.executable, DDPRUN_LOG_LEVEL="info")
        e.update(env or {})
        self.proc = subprocess.Popen(self.cmd, stdout=open(self.out_path, "w"),
                                     stderr=open(self.err_path, "w"), env=e,
                                     start_new_session=True)
        self.started = time.time()
        test.nodes.append(self)

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise Failure("%s did not exit within %.0f s" % (self.name, timeout))

    def signal(self, sig):
        self.proc.send_signal(sig)

    def stderr(self):
        with open(self.err_path) as f:
            return f.read()

    def stdout(self):
        with open(self.out_path) as f:
            return f.read()


class MultiNodeTest:
    """A scenario: a temporary directory, the nodes started, cleanup of every process."""

    def __init__(self, name):
        self.name = name
        self.dir = tempfile.mkdtemp(prefix="ddprun-mn-%s-" % name)
        self.out = os.path.join(self.dir, "workers")
        self.nodes = []
        self.port = free_port("127.0.0.2")
        self.cleanups = []  # more to stop after the agents (e.g. an etcd cluster)

    def endpoint(self, host="127.0.0.2"):
        return "%s:%d" % (host, self.port)

    def agent(self, name, addr, nnodes, rdzv_id, worker_args, nproc=1, conf=FAST_CONF,
              extra=(), endpoint=None, env=None, prefix=(), rdzv=None):
        """Starts `ddprun` as node `name` advertising `addr`; its workers record into
        <out>/<name>. `rdzv` replaces the c10d backend flags (e.g. for the static backend)."""
        if rdzv is None:
            rdzv = ["--rdzv-backend=c10d", "--rdzv-endpoint=%s" % (endpoint or self.endpoint()),
                    "--rdzv-id=%s" % rdzv_id]
        local = ["--local-addr=%s" % addr] if addr else []  # None: ddprun finds it
        args = ["--nnodes=%s" % nnodes, "--nproc-per-node=%d" % nproc] + rdzv + local + \
            ["--rdzv-conf=%s" % conf] + list(extra) + \
            [WORKER, "--out", os.path.join(self.out, name)] + list(worker_args)
        return Node(self, name, args, env=env, prefix=prefix)

    def starts(self, node=None, world=None, after=0.0):
        """Worker starts recorded so far (each with its "node"), oldest first; optionally only
        those of one node, one world size, or that started after time `after`."""
        recs = []
        for path in glob.glob(os.path.join(self.out, "*", "start-*.json")):
            with open(path) as f:
                r = json.load(f)
            r["node"] = os.path.basename(os.path.dirname(path))
            if node not in (None, r["node"]) or world not in (None, int(r["WORLD_SIZE"])) or \
                    r["started"] <= after:
                continue
            recs.append(r)
        return sorted(recs, key=lambda r: r["passed"])

    def wait_for(self, what, pred, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = pred()
            if value:
                return value
            time.sleep(0.02)
        raise Failure("timed out after %.0f s waiting for %s" % (timeout, what))

    def wait_for_value(self, pred, timeout):
        """Polls pred() until it is falsy or `timeout` passes; returns its last value."""
        deadline = time.time() + timeout
        value = pred()
        while value and time.time() < deadline:
            time.sleep(0.05)
            value = pred()
        return value

    def cleanup(self):
        for n in self.nodes:
            if n.proc.poll() is None:
                try:
                    os.killpg(n.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                n.proc.wait()
        for fn in self.cleanups:
            fn()

    def dump(self):
        for n in self.nodes:
            print("---- %s: %s (exit %s)" % (n.name, " ".join(n.cmd), n.proc.poll()))
            for label, text in (("stdout", n.stdout()), ("stderr", n.stderr())):
                lines = text.splitlines()
                print("  [%s, last 40 of %d lines]" % (label, len(lines)))
                for line in lines[-40:]:
                    print("    " + line)
        for r in self.starts():
            print("  start:", json.dumps(r, sort_keys=True))


def run(scenarios):
    """Runs the scenario named by argv[1]: exit 0 pass, 1 fail, 77 skip."""
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    if name not in scenarios:
        print("usage: %s {%s}" % (sys.argv[0], ",".join(sorted(scenarios))))
        return 2
    if not os.access(DDPRUN, os.X_OK):
        print("FAIL: %s is not built" % DDPRUN)
        return 1
    t = MultiNodeTest(name)
    t0 = time.time()
    try:
        result = scenarios[name](t)
        if result == SKIP:
            return SKIP
        print("PASS: %s (%.1f s)" % (name, time.time() - t0))
        shutil.rmtree(t.dir, ignore_errors=True)
        return 0
    except Failure as e:
        print("FAIL: %s: %s" % (name, e))
        t.dump()
        print("(files kept in %s)" % t.dir)
        return 1
    finally:
        t.cleanup()
