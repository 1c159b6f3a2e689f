"""The rendezvous store declared lost by an agent's heartbeat while that agent is not running
workers (issue 20; docs/rendezvous.md, "Failures"): joining, or about to start its workers. The
contract: the agent prints one line naming the store's address and why, starts no workers after
it, and exits 1 within the keep-alive bound and a small margin. And the agent that hosts the
store in process never judges its own store: a stalled store thread is for the other agents
to report. Real agents on loopback addresses (harness.py). Usage: store_lost_scenarios.py NAME.
"""
import os
import signal
import sys
import time

from harness import FAST_CONF, PtraceRefused, check, run, stopped_answering, stopped_thread, \
    thread_state

# read_timeout 30 s: an agent that is done within a few seconds was cut short by its heartbeat's
# keep-alive bound (0.3 s x 3), not by a store call timing out.
CONF = FAST_CONF.replace("read_timeout=3", "read_timeout=30")
BOUND = 0.9  # heartbeat x missed_heartbeats of FAST_CONF


def nothing_after_loss(node):
    """After its heartbeat declared the store lost, `node` started no workers and evicted
    nobody."""
    err = node.stderr()
    print("node %s, from the loss on:\n  %s" % (
        node.name, "\n  ".join(err[err.find("[", err.find("lost the rendezvous store") - 40):]
                              .splitlines())))
    after = err[err.find("lost the rendezvous store"):]
    check("started 1 worker" not in after, "%s started no workers after the loss: %s" %
          (node.name, after[-800:]))
    check("was evicted" not in after, "%s evicted nobody after the loss: %s" %
          (node.name, after[-800:]))
    # The loss is the one cause given: not the error of the store call it cut short.
    check("closed the connection" not in after and "interrupted" not in after,
          "%s names no other cause: %s" % (node.name, after[-800:]))


def store_frozen_while_joining(t):
    """Nodes a (the store host) and b wait for a third node that never comes; a is stopped
    (SIGSTOP). b's heartbeat declares the store lost and its join, waiting on the store, is cut
    short: b exits 1 within the bound and a margin, having started nothing."""
    a = t.agent("a", "127.0.0.2", "3", "joinfrozen", ["--finish-at-world", "99"], conf=CONF)
    b = t.agent("b", "127.0.0.3", "3", "joinfrozen", ["--finish-at-world", "99"], conf=CONF)
    t.wait_for("b joining", lambda: "connected to rendezvous" in b.stderr(), 30)
    time.sleep(1.0)  # b's join is waiting on the store, its heartbeat beating
    a.signal(signal.SIGSTOP)
    try:
        frozen = time.time()
        code = b.wait(40)
        took = time.time() - frozen
    finally:
        a.signal(signal.SIGKILL)
    print("node b exited %s, %.2f s after the store host was stopped while it joined (bound "
          "0.9 s, read_timeout 30 s)" % (code, took))
    err = b.stderr()
    check(code == 1, "b exits 1 (got %s): %s" % (code, err[-800:]))
    check(took < BOUND + 4, "b is done within the bound and a margin: %.2f s: %s"
          % (took, err[-800:]))
    stopped_answering(b, t.endpoint())
    nothing_after_loss(b)
    check(not t.starts(), "no worker started: %s" % t.starts())


def store_lost_before_workers_start(t):
    """b's round closes while b's main thread (its io_context, which starts the workers) is
    stopped (ptrace), so the round's completion waits in its queue; then the store host a is
    stopped (SIGSTOP) and b's heartbeat, on a thread of its own, declares the store lost. When
    b's main thread runs again, b must not start the workers of a round it joined through a
    store it has declared lost: it exits 1 without starting any."""
    a = t.agent("a", "127.0.0.2", "3", "lostbeforestart", ["--finish-at-world", "99"], conf=CONF)
    b = t.agent("b", "127.0.0.3", "3", "lostbeforestart", ["--finish-at-world", "99"], conf=CONF)
    t.wait_for("b joining", lambda: "connected to rendezvous" in b.stderr(), 30)
    try:
        with stopped_thread(b.proc.pid):
            c = t.agent("c", "127.0.0.4", "3", "lostbeforestart", ["--finish-at-world", "99"],
                        conf=CONF)
            t.wait_for("a's and c's workers started", lambda: all(
                "started 1 worker" in n.stderr() for n in (a, c)), 30)
            t.wait_for("b's round closed", lambda: "round 0 closed" in b.stderr(), 10)
            a.signal(signal.SIGSTOP)
            t.wait_for("b's heartbeat declaring the store lost",
                       lambda: "lost the rendezvous store" in b.stderr(), 10)
            resumed = time.time()
    except PtraceRefused as e:
        print("SKIP: cannot stop one thread of the agent: %s" % e)
        return 77
    try:
        code = b.wait(40)
        took = time.time() - resumed
    finally:
        a.signal(signal.SIGKILL)
    print("node b exited %s, %.2f s after its main thread ran again" % (code, took))
    err = b.stderr()
    check(code == 1, "b exits 1 (got %s): %s" % (code, err[-800:]))
    check(took < 4, "b is done at once: %.2f s: %s" % (took, err[-800:]))
    stopped_answering(b, t.endpoint())
    nothing_after_loss(b)
    check(c.wait(40) == 1, "c exits 1 too (got %s)" % c.proc.returncode)


def store_thread(pid):
    """The thread id of the rendezvous store's thread in agent `pid` (named ddprun-store)."""
    for tid in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
            if f.read().strip() == "ddprun-store":
                return int(tid)
    return None


def store_thread_stalled_on_host(t):
    """Only the store's thread of the store host a is stopped (ptrace), for 2.7 s, 3x the
    keep-alive bound: what a starved store thread looks like to the job (256 agents on 2 cores
    without CAP_SYS_NICE). The other agent b is the judge: its heartbeat declares the store
    lost, and b stops its worker and exits 1. The host does not judge its own store: a's own
    beats were as late, but a says nothing of a lost store and runs on (its round re-forms
    without b, and it waits for a node to join) until the test stops it (SIGTERM: 143)."""
    a = t.agent("a", "127.0.0.2", "2", "hoststalled", ["--finish-at-world", "99"], conf=CONF)
    b = t.agent("b", "127.0.0.3", "2", "hoststalled", ["--finish-at-world", "99"], conf=CONF)
    t.wait_for("both workers started",
               lambda: all("started 1 worker" in n.stderr() for n in (a, b)), 30)
    check("hosting the rendezvous store at " + t.endpoint() in a.stderr(),
          "a hosts the store: %s" % a.stderr()[-400:])
    tid = store_thread(a.proc.pid)
    check(tid, "a has a thread named ddprun-store")
    try:
        with stopped_thread(tid):
            check(thread_state(a.proc.pid, tid) == "t" and
                  thread_state(a.proc.pid, a.proc.pid) != "t",
                  "only a's store thread is stopped")
            time.sleep(2.7)
            check(a.proc.poll() is None, "a still runs with its store thread stopped (exit %s): "
                  "%s" % (a.proc.returncode, a.stderr()[-800:]))
    except PtraceRefused as e:
        print("SKIP: cannot stop one thread of the agent: %s" % e)
        return 77
    resumed = time.time()
    code = b.wait(30)
    err = b.stderr()
    check(code == 1, "b exits 1 (got %s): %s" % (code, err[-800:]))
    stopped_answering(b, t.endpoint())
    nothing_after_loss(b)
    time.sleep(max(0.0, resumed + 3.0 - time.time()))  # a's own beats answered again meanwhile
    aerr = a.stderr()
    check(a.proc.poll() is None, "a runs on, 3 s after its store thread ran again (exit %s): %s"
          % (a.proc.returncode, aerr[-800:]))
    check("lost the rendezvous store" not in aerr and "stopped answering" not in aerr,
          "a did not declare its own store lost: %s" % aerr[-800:])
    a.signal(signal.SIGTERM)
    check(a.wait(30) == 128 + signal.SIGTERM, "a leaves on SIGTERM (exit %s): %s" %
          (a.proc.returncode, a.stderr()[-800:]))


HEAP_MAX = 64 << 20  # glibc's reservation for a thread's malloc arena on 64-bit (HEAP_MAX_SIZE)


def thread_arenas(pid):
    """The malloc arenas of `pid` other than glibc's main one, from /proc/<pid>/maps: glibc
    reserves each such arena's heap as 64 MiB aligned to 64 MiB and makes its start readable and
    writable, so each is an anonymous rw-p mapping that starts at a multiple of 64 MiB and ends
    within it. The main arena grows by brk ([heap]); a thread's stack starts one guard page
    above its mmap, so neither is counted."""
    found = []
    with open("/proc/%d/maps" % pid) as f:
        for line in f:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            anonymous = len(fields) < 6
            if anonymous and fields[1] == "rw-p" and start % HEAP_MAX == 0 and \
                    end - start <= HEAP_MAX:
                found.append(fields[0])
    return found


def store_host_own_arena(t):
    """The store host's threads allocate from malloc arenas of their own; every other agent
    keeps one arena for all of its threads (docs/rendezvous.md, "The store's malloc arena and
    real-time priority"). Sharing the one arena, the store's thread waited on its lock while a
    thread of normal priority that held it was preempted, up to 2.5 s at 256 agents: the other
    agents declared the store lost. Seen from outside in /proc/<pid>/maps: the host has at least
    one thread arena (a 64 MiB-aligned heap) once its store served the round, b has none."""
    gate = os.path.join(t.dir, "finish")
    a = t.agent("a", "127.0.0.2", "2", "arenas", ["--exit-when", gate], conf=CONF)
    b = t.agent("b", "127.0.0.3", "2", "arenas", ["--exit-when", gate], conf=CONF)
    t.wait_for("both workers started",
               lambda: all("started 1 worker" in n.stderr() for n in (a, b)), 30)
    check("hosting the rendezvous store at " + t.endpoint() in a.stderr(),
          "a hosts the store: %s" % a.stderr()[-400:])
    check(store_thread(a.proc.pid), "a has a thread named ddprun-store")
    check(len(os.listdir("/proc/%d/task" % b.proc.pid)) > 1,
          "b runs more than one thread (its heartbeat's), which could have had arenas")
    host, other = thread_arenas(a.proc.pid), thread_arenas(b.proc.pid)
    print("thread arenas: a (host) %s, b %s" % (host, other))
    check(len(host) >= 1, "the host's threads have arenas of their own: %s" % host)
    check(other == [], "b's threads share the main arena (none of their own): %s" % other)
    open(gate, "w").close()
    for n in (a, b):
        check(n.wait(30) == 0, "%s exits 0 (got %s): %s" % (n.name, n.proc.returncode,
                                                          n.stderr()[-600:]))


SCENARIOS = {f.__name__: f for f in (store_frozen_while_joining, store_lost_before_workers_start,
                                     store_thread_stalled_on_host, store_host_own_arena)}

if __name__ == "__main__":
    sys.exit(run(SCENARIOS))
