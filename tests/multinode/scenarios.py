"""Multi-node scenarios: several real ddprun agents on one machine, each a "node" with its own
loopback address (127.0.0.2, 127.0.0.3, ...). Usage: scenarios.py NAME (exit 0 / 1 / 77)."""
import json
import os
import signal
import subprocess
import sys
import time

from harness import BIN, FAST_CONF, SKIP, Node, PtraceRefused, check, exit_times, \
    foreign_listener, free_port, pid_alive, run, skip_unless_ci, stopped_answering, \
    stopped_thread, thread_state


def group_ranks(t, node):
    return sorted({int(r["GROUP_RANK"]) for r in t.starts(node=node)})


def ranks_in(starts):
    """node name -> its node rank, for the starts of one round."""
    return {r["node"]: int(r["GROUP_RANK"]) for r in starts}


# --rdzv-conf with node ranks kept from the round before (the default is arrival order).
STABLE_CONF = FAST_CONF + ",rank_order=stable"


def check_round(starts, addrs):
    """What every round promises in either rank order (arrival, the default, or
    rank_order=stable), for the starts of one round: one node rank per node, dense from 0, and
    MASTER_ADDR the address of the node that holds node rank 0 (its agent hosts that round's
    workers' store). `addrs`: node name -> its address. Returns node name -> node rank."""
    ranks = ranks_in(starts)
    check(all(len({r["GROUP_RANK"] for r in starts if r["node"] == n}) == 1 for n in ranks),
          "one node rank per node: %s" % ranks)
    check(sorted(ranks.values()) == list(range(len(ranks))), "dense node ranks: %s" % ranks)
    first = [n for n, k in ranks.items() if k == 0][0]
    check(all(r["MASTER_ADDR"] == addrs[first] for r in starts),
          "MASTER_ADDR is node rank 0's (%s, %s): %s" %
          (first, addrs[first], sorted({r["MASTER_ADDR"] for r in starts})))
    return ranks


def fixed_two_nodes(t):
    """--nnodes=2, 2 workers per node: one world of 4, ranks by node, one master. The store
    host's workers finish first; it must stay up until the slower node has passed the exit
    barrier (pytorch#118891), so both exit 0 and the host exits last."""
    a = t.agent("a", "127.0.0.2", "2", "fixed", ["--run", "0.2"], nproc=2)
    b = t.agent("b", "127.0.0.3", "2", "fixed", ["--run", "1.5"], nproc=2)
    exited = exit_times((a, b), 60)
    check(a.proc.returncode == 0, "node a exit code %s" % a.proc.returncode)
    check(b.proc.returncode == 0, "node b exit code %s" % b.proc.returncode)
    # The store host stayed up until the slower node was through the exit barrier: had it
    # left before, node b would say so (and still exit 0, as torchrun does). Not a comparison
    # of exit times: b's own clean-up after the barrier may legitimately outlast a's.
    print("exits: a %.3f, b %.3f" % (exited["a"], exited["b"]))
    check("exit barrier did not complete" not in b.stderr(),
          "node b passed the exit barrier with the store host still up")
    starts = t.starts()
    check(len(starts) == 4, "4 workers started (got %d)" % len(starts))
    check(sorted(int(r["RANK"]) for r in starts) == [0, 1, 2, 3], "global ranks 0..3")
    for r in starts:
        check(r["WORLD_SIZE"] == "4" and r["GROUP_WORLD_SIZE"] == "2", "world 4 on 2 nodes")
        check(r["MASTER_PORT"] == starts[0]["MASTER_PORT"], "one MASTER_PORT")
        check(r["TORCHELASTIC_RUN_ID"] == "fixed", "run id is the rdzv id")
        check(r["arrived"] <= 4, "a fresh worker store (arrival %d)" % r["arrived"])
    # Node ranks in arrival order (the default): either node may be node rank 0.
    ranks = check_round(starts, {"a": "127.0.0.2", "b": "127.0.0.3"})
    second = [n for n, k in ranks.items() if k == 1][0]
    check(sorted(int(r["RANK"]) for r in t.starts(node=second)) == [2, 3],
          "node rank 1 (%s) has ranks 2, 3" % second)


def join_mid_run(t, conf=FAST_CONF):
    """--nnodes=1:3: a third node arriving while the job runs restarts everybody in a larger
    world, spending no restart; node ranks in arrival order (the default): dense, and
    MASTER_ADDR is node rank 0's in each round."""
    addrs = {"a": "127.0.0.2", "b": "127.0.0.3", "c": "127.0.0.1"}
    a = t.agent("a", addrs["a"], "1:3", "grow", ["--finish-at-world", "3"], conf=conf)
    b = t.agent("b", addrs["b"], "1:3", "grow", ["--finish-at-world", "3"], conf=conf)
    t.wait_for("a round of 2", lambda: len(t.starts(world=2)) == 2, 30)
    c = t.agent("c", addrs["c"], "1:3", "grow", ["--finish-at-world", "3"], conf=conf)
    for n in (a, b, c):
        check(n.wait(60) == 0, "node %s exit code %s" % (n.name, n.proc.returncode))
    three = t.starts(world=3)
    check(len(three) == 3, "3 workers in the world of 3 (got %d)" % len(three))
    check(all(r["TORCHELASTIC_RESTART_COUNT"] == "0" for r in t.starts()), "no restart spent")
    before, after = check_round(t.starts(world=2), addrs), check_round(three, addrs)
    print("node ranks: %s -> %s" % (before, after))
    if conf == STABLE_CONF:
        check(all(after[n] == before[n] for n in ("a", "b")), "a and b keep their ranks: %s -> %s"
              % (before, after))
        check(after["c"] == 2, "the newcomer takes rank 2, though its address sorts first")
    # The launcher counts attempts as the workers do (TORCHELASTIC_RESTART_COUNT): the larger
    # world is a new round of attempt 0.
    check("of 3 (attempt 0, round " in a.stderr(), "a logs attempt 0 for the world of 3")


def join_mid_run_stable(t):
    """join_mid_run with --rdzv-conf rank_order=stable: the first two keep their node ranks and
    the newcomer takes the free one, though its address sorts first."""
    join_mid_run(t, STABLE_CONF)


def kill_agent(t, conf=FAST_CONF):
    """kill -9 of one agent: the survivors evict it after the heartbeat timeout, stop their
    workers at once and carry on in a smaller world; the killed agent leaves no worker. Node
    ranks in arrival order (the default): dense in each round, MASTER_ADDR node rank 0's. The
    killed agent b hosts no store (the endpoint is a's): with arrival ranks it may well have
    been node rank 0, whose agent hosted the workers' store of the round of 3."""
    gate = os.path.join(t.dir, "gate")  # an early round of 2 (MIN=1) must not end the job
    addrs = {"a": "127.0.0.2", "b": "127.0.0.3", "c": "127.0.0.4"}
    nodes = [t.agent(n, addr, "1:3", "shrink", ["--finish-at-world", "2", "--gate", gate],
                     conf=conf)
             for n, addr in addrs.items()]
    t.wait_for("a round of 3", lambda: len(t.starts(world=3)) == 3, 30)
    victim_workers = [r["pid"] for r in t.starts(node="b")]
    open(gate, "w").close()
    killed = time.time()
    nodes[1].signal(signal.SIGKILL)
    for n in (nodes[0], nodes[2]):
        check(n.wait(60) == 0, "node %s exit code %s" % (n.name, n.proc.returncode))
    # (With MIN=1 an early round of 2 may have run before c arrived: look after the kill.)
    two = t.starts(world=2, after=killed)
    check(sorted(r["node"] for r in two) == ["a", "c"], "a and c form the world of 2")
    took = min(r["started"] for r in two) - killed
    print("new workers started %.2f s after the kill (heartbeat timeout 0.9 s)" % took)
    check(took < 10, "survivors restarted within 10 s (took %.1f)" % took)
    check(not any(pid_alive(p) for p in victim_workers), "the killed agent's workers are gone")
    before, after = check_round(t.starts(world=3), addrs), check_round(two, addrs)
    print("node ranks: %s -> %s" % (before, after))
    if conf == STABLE_CONF:
        for n in ("a", "c"):
            if before[n] < 2:
                check(after[n] == before[n], "node %s keeps rank %d" % (n, before[n]))
    check(any("evicted" in n.stderr() for n in (nodes[0], nodes[2])), "eviction logged")


def kill_agent_stable(t):
    """kill_agent with --rdzv-conf rank_order=stable: a survivor whose node rank is still in
    the smaller world keeps it."""
    kill_agent(t, STABLE_CONF)


def worker_failure(t):
    """A worker failure on node rank 1 restarts both nodes; the budget counts once per job."""
    args = ["--fail-once", "1", "3", "--run", "0.3"]
    a = t.agent("a", "127.0.0.2", "2", "fail", args, extra=["--max-restarts=1"])
    b = t.agent("b", "127.0.0.3", "2", "fail", args, extra=["--max-restarts=1"])
    check(a.wait(60) == 0, "node a exit code %s" % a.proc.returncode)
    check(b.wait(60) == 0, "node b exit code %s" % b.proc.returncode)
    for node in ("a", "b"):
        counts = [r["TORCHELASTIC_RESTART_COUNT"] for r in t.starts(node=node)]
        check(counts == ["0", "1"], "node %s started twice, restart counts 0 then 1 (got %s)"
              % (node, counts))


def summary_lines(node):
    return [line for line in node.stderr().splitlines() if line.startswith("ddprun: job '")]


def failure_roles(t):
    """For a job whose node rank 1 always fails (two rounds): the node that spent the restart
    (node rank 1 of the first round) and the one whose failure ended the job (node rank 1 of the
    second). In arrival order (the default) they may be different nodes."""
    def node_at(count):
        return [r["node"] for r in t.starts() if r["TORCHELASTIC_RESTART_COUNT"] == count and
                r["GROUP_RANK"] == "1"]
    first, last = node_at("0"), node_at("1")
    check(len(first) == 1 and len(last) == 1, "one node rank 1 in each round: %s, %s" %
          (first, last))
    return first[0], last[0]


def failure_ends_job(t):
    """With the budget spent, every node stops with the root cause's exit code and the same
    one-line summary; the node that prints the FAILED report exits right after."""
    args = ["--always-fail", "1", "7", "--run", "30"]
    a = t.agent("a", "127.0.0.2", "2", "fatal", args, extra=["--max-restarts=1"])
    b = t.agent("b", "127.0.0.3", "2", "fatal", args, extra=["--max-restarts=1"])
    exited = exit_times((a, b), 60)
    check(b.proc.returncode == 7, "node b exit code %s, expected 7" % b.proc.returncode)
    check(a.proc.returncode == 7, "node a exit code %s, expected 7" % a.proc.returncode)
    check(len(t.starts(node="a")) == 2 and len(t.starts(node="b")) == 2,
          "one restart, counted once for the job")
    nodes = {"a": a, "b": b}
    spent, root = failure_roles(t)  # node rank 1 of round 0, and of round 1 (the root cause)
    print("node rank 1: %s in the first round (spent the restart), %s in the second" %
          (spent, root))
    other = "b" if root == "a" else "a"
    check("no restart is left" in nodes[other].stderr(), "node %s names the cause" % other)
    check("FAILED" in nodes[root].stderr() and "Root cause" in nodes[root].stderr(),
          "node %s (the root cause) prints the report" % root)
    sa, sb = summary_lines(a), summary_lines(b)
    check(len(sa) == 1 and sa == sb, "one identical summary line on both nodes: %s / %s" % (sa, sb))
    check("FAILED (exit code 7)" in sa[0], "the summary names the exit code: %s" % sa[0])
    check(abs(exited["a"] - exited["b"]) < 3, "both nodes end within 3 s of each other "
          "(a %.2f, b %.2f)" % (exited["a"], exited["b"]))
    check("restart 1 of 1 spent by this node" in nodes[spent].stderr(),
          "%s says it spent the restart" % spent)
    elsewhere = "b" if spent == "a" else "a"
    check("restart 1 of 1 spent there" in nodes[elsewhere].stderr(),
          "%s says the restart was spent elsewhere" % elsewhere)


def not_retryable(t):
    """A worker error that a restart cannot fix (its error file says so) ends the job at once on
    every node, with its message, however many restarts are left."""
    args = ["--fatal", "1", "2", "--run", "30"]
    a = t.agent("a", "127.0.0.2", "2", "fatal2", args, extra=["--max-restarts=5"])
    b = t.agent("b", "127.0.0.3", "2", "fatal2", args, extra=["--max-restarts=5"])
    check(b.wait(60) == 2, "node b exit code %s, expected 2" % b.proc.returncode)
    check(a.wait(60) == 2, "node a exit code %s, expected 2" % a.proc.returncode)
    check(len(t.starts()) == 2, "one start per node: no restart (%d starts)" % len(t.starts()))
    sa, sb = summary_lines(a), summary_lines(b)
    check(len(sa) == 1 and sa == sb, "one identical summary line: %s / %s" % (sa, sb))
    check("does not fit" in sa[0] and "not retryable" in sa[0], "the message: %s" % sa[0])
    # Node ranks follow arrival (the default): rank 1 runs on either node.
    root = a if "rank 1 (local rank 0, pid" in a.stderr() else b
    check("retryable  : no" in root.stderr(),
          "the report of %s (rank 1's node) says why" % root.name)


def paused_node_while_finishing(t):
    """Node b's agent is paused (SIGSTOP) while the job completes; its worker finishes anyway.
    No new round or worker starts anywhere; a evicts b as lost in the exit barrier and the job
    is finished. a does not wait close_timeout (5 s) for b to read the end: b is lost and silent
    for the keep-alive bound, as a node that will never come back (issue 20), so a exits 0
    within about a bound. Resumed after the store host has gone, b still exits 0 (its workers
    succeeded), saying why."""
    gate = os.path.join(t.dir, "gate")
    a = t.agent("a", "127.0.0.2", "1:2", "pause", ["--exit-when", gate])
    b = t.agent("b", "127.0.0.3", "1:2", "pause", ["--exit-when", gate])
    t.wait_for("a round of 2", lambda: len(t.starts(world=2, node=b.name)) == 1 and
               len(t.starts(world=2, node=a.name)) == 1, 30)
    started_before = len(t.starts(node=a.name)) + len(t.starts(node=b.name))
    b.signal(signal.SIGSTOP)
    open(gate, "w").close()  # both workers finish; b's agent cannot see it
    t.wait_for("a to evict b", lambda: "evicted" in a.stderr(), 10)
    evicted = time.time()
    try:
        check(a.wait(30) == 0, "node a exit code %s" % a.proc.returncode)
        took = time.time() - evicted
    finally:
        b.signal(signal.SIGCONT)
    print("a exited %.2f s after it evicted b (keep-alive bound 0.9 s, close_timeout 5 s)" % took)
    check(took < 4.0, "a did not wait close_timeout for b, lost and silent: %.2f s: %s" %
          (took, a.stderr()[-800:]))
    check(b.wait(30) == 0, "node b exit code %s" % b.proc.returncode)
    check(len(t.starts(node=a.name)) + len(t.starts(node=b.name)) == started_before,
          "no worker started after the job finished")
    sa = summary_lines(a)
    check(len(sa) == 1 and "finished" in sa[0] and "lost in the exit barrier" in sa[0],
          "a's summary: %s" % sa)
    check("exiting 0" in b.stderr(), "b says why it exits 0: %s" % b.stderr()[-400:])


def standalone_store(args=(), stderr=None):
    """A ddprun-store on 127.0.0.1 at a free port with `args`, once it says it listens: the
    process (the caller stops it) and its endpoint."""
    port = free_port("127.0.0.1")
    store = subprocess.Popen([os.path.join(BIN, "ddprun-store"), "--host", "127.0.0.1",
                              "--port", str(port)] + list(args), stdout=subprocess.PIPE,
                             stderr=stderr)
    store.stdout.readline()  # "ddprun-store listening on ..."
    return store, "127.0.0.1:%d" % port


def two_jobs(t):
    """Two jobs on one ddprun-store endpoint with different --rdzv-id stay apart."""
    store, ep = standalone_store()
    try:
        nodes = [t.agent(name, addr, "2", job, ["--run", "0.2"], endpoint=ep)
                 for name, addr, job in (("x1", "127.0.0.2", "jobx"), ("y1", "127.0.0.4", "joby"),
                                         ("x2", "127.0.0.3", "jobx"), ("y2", "127.0.0.5", "joby"))]
        for n in nodes:
            check(n.wait(60) == 0, "node %s exit code %s" % (n.name, n.proc.returncode))
    finally:
        store.terminate()
        store.wait()
    # Each job's round is its own two nodes: its run id, and node rank 0 one of its own.
    for job, names in (("jobx", ("x1", "x2")), ("joby", ("y1", "y2"))):
        starts = [r for n in names for r in t.starts(node=n)]
        check(len(starts) == 2 and all(r["WORLD_SIZE"] == "2" and r["TORCHELASTIC_RUN_ID"] == job
                                       for r in starts), "%s's workers only: %s" % (job, starts))
        check_round(starts, {"x1": "127.0.0.2", "x2": "127.0.0.3", "y1": "127.0.0.4",
                             "y2": "127.0.0.5"})


def wrong_store(t):
    """An endpoint that is not a ddprun store, and a second job wanting to host on a port
    already taken, both fail with a message naming the endpoint: nobody merges."""
    srv = foreign_listener(b"HTTP/1.0 400 Bad Request\r\n\r\n", 8, accepts=4)
    foreign = "127.0.0.1:%d" % srv.getsockname()[1]
    n = t.agent("foreign", "127.0.0.3", "2", "lost", [], endpoint=foreign)
    check(n.wait(30) != 0, "joining a foreign server fails")
    check(foreign in n.stderr() and "ddprun" in n.stderr(), "message names the endpoint: %s"
          % n.stderr()[-300:])
    srv.close()

    # An authenticating ddprun-store, and a node with another token.
    right, wrong = os.path.join(t.dir, "right.token"), os.path.join(t.dir, "wrong.token")
    for path, token in ((right, "s3cret-of-this-job"), (wrong, "another-jobs-token")):
        with open(path, "w") as f:
            f.write(token + "\n")
        os.chmod(path, 0o600)  # a token file others may read is refused
    store, ep = standalone_store(["--auth-token-file", right], stderr=subprocess.DEVNULL)
    try:
        n = t.agent("token", "127.0.0.4", "2", "tok", [], endpoint=ep,
                    env={"DDPRUN_STORE_TOKEN_FILE": wrong})
        check(n.wait(30) != 0, "a wrong token fails")
        check(ep in n.stderr() and "refused our authentication token" in n.stderr(),
              "message names the endpoint and the token: %s" % n.stderr()[-300:])
    finally:
        store.terminate()
        store.wait()

    first = t.agent("first", "127.0.0.2", "2", "one", ["--run", "30"])
    t.wait_for("the first job's store", lambda: "hosting the rendezvous store" in
               first.stderr() or first.proc.poll() is not None, 20)
    second = t.agent("second", "127.0.0.2", "2", "two", ["--run", "30"])
    check(second.wait(30) == 1, "the second host exits 1 (got %s)" % second.proc.returncode)
    check("cannot host the rendezvous store at " + t.endpoint() in second.stderr(),
          "message names the endpoint: %s" % second.stderr()[-300:])
    first.signal(signal.SIGTERM)
    check(first.wait(30) == 128 + signal.SIGTERM, "the first job's agent left on SIGTERM")


def store_host_and_other(t, job):
    """Starts agent a (which hosts the store, at the endpoint) and agent b, and waits for their
    round of 2; returns a, b and the pids of b's workers."""
    a = t.agent("a", "127.0.0.2", "2", job, ["--finish-at-world", "99"])
    b = t.agent("b", "127.0.0.3", "2", job, ["--finish-at-world", "99"])
    t.wait_for("a round of 2", lambda: len(t.starts()) == 2, 30)
    return a, b, [r["pid"] for r in t.starts(node="b")]


def store_host_and_gated(t, job, gate_name):
    """Starts agent a (which hosts the store, at the endpoint; its worker runs 60 s) and agent b
    (its worker succeeds once the file <dir>/<gate_name> exists), both with read_timeout 30 s,
    and waits for their round of 2; returns a, b and the gate's path."""
    conf = FAST_CONF.replace("read_timeout=3", "read_timeout=30")
    gate = os.path.join(t.dir, gate_name)
    a = t.agent("a", "127.0.0.2", "2", job, ["--run", "60"], conf=conf)
    b = t.agent("b", "127.0.0.3", "2", job, ["--exit-when", gate], conf=conf)
    t.wait_for("a round of 2", lambda: len(t.starts()) == 2, 30)
    return a, b, gate


def store_host_lost(t):
    """Losing the store host: every other agent fails within its timeout, naming the endpoint,
    and stops its workers."""
    a, b, workers = store_host_and_other(t, "hostless")
    killed = time.time()
    a.signal(signal.SIGKILL)
    code = b.wait(30)
    took = time.time() - killed
    print("node b failed %.2f s after the store host was killed (read_timeout 3 s)" % took)
    check(code != 0, "node b fails (exit %s)" % code)
    check(t.endpoint() in b.stderr(), "its message names the endpoint %s" % t.endpoint())
    check(not any(pid_alive(p) for p in workers), "node b's workers are gone")


def store_host_lost_in_exit_barrier(t):
    """The store host is killed just as node b's worker succeeds, so b's agent meets a dead store
    in its exit barrier (the watcher's connection already gone): b exits 0 -- its workers
    succeeded -- within a few keep-alive bounds, naming the endpoint, not after read_timeout
    (30 s here) spent reconnecting to a store its heartbeat already declared lost."""
    a, b, gate = store_host_and_gated(t, "barrierlost", "gate-barrier")
    b.signal(signal.SIGSTOP)
    try:
        open(gate, "w").close()  # b's worker succeeds while its agent is paused
        time.sleep(0.3)
        killed = time.time()
        a.signal(signal.SIGKILL)
        check(a.wait(30) == -signal.SIGKILL, "the store host is gone")
        time.sleep(0.3)
    finally:
        b.signal(signal.SIGCONT)
    code = b.wait(60)
    took = time.time() - killed
    print("node b exited %s, %.2f s after the store host was killed (keep-alive bound 0.9 s, "
          "read_timeout 30 s)" % (code, took))
    err = b.stderr()
    check(code == 0, "node b exits 0, its workers having succeeded (got %s): %s"
          % (code, err[-600:]))
    check(took < 10, "node b is done within 10 s, not read_timeout: %.2f s: %s"
          % (took, err[-800:]))
    check(t.endpoint() in err, "its message names the endpoint %s: %s" % (t.endpoint(), err[-600:]))


def store_host_frozen_in_exit_barrier(t):
    """The store host is stopped (SIGSTOP) just before node b's worker succeeds, so b's agent
    sends its exit barrier's ADD to a store that accepts and never answers: once b's heartbeat
    declares the store lost (keep-alive bound 0.9 s), the ADD is cut short and b exits 0 -- its
    workers succeeded -- naming the endpoint, instead of waiting out read_timeout (30 s here)
    for the reply."""
    a, b, gate = store_host_and_gated(t, "barrierfrozen", "gate-frozen-barrier")
    a.signal(signal.SIGSTOP)
    try:
        frozen = time.time()
        open(gate, "w").close()  # b's worker succeeds, b's agent meets the frozen store
        code = b.wait(60)
        took = time.time() - frozen
    finally:
        a.signal(signal.SIGKILL)  # SIGKILL ends a stopped process too
    print("node b exited %s, %.2f s after the store host was stopped (keep-alive bound 0.9 s, "
          "read_timeout 30 s)" % (code, took))
    err = b.stderr()
    check(code == 0, "node b exits 0, its workers having succeeded (got %s): %s"
          % (code, err[-600:]))
    check(took < 5, "node b is done within 5 s, not after a handshake timeout (10 s) or "
          "read_timeout: %.2f s: %s" % (took, err[-800:]))
    stopped_answering(b, t.endpoint())


def store_host_frozen(t):
    """The agent hosting the store (and the agent store) is stopped (SIGSTOP): the other agent
    reports the store stopped answering, naming its address, within the keep-alive bound (it
    measures the silence), fails and stops its workers."""
    a, b, workers = store_host_and_other(t, "frozen")
    frozen = time.time()
    a.signal(signal.SIGSTOP)
    try:
        code = b.wait(60)
        print("node b failed %.2f s after the store host was stopped (keep-alive bound 0.9 s)"
              % (time.time() - frozen))
    finally:
        a.signal(signal.SIGKILL)  # SIGKILL ends a stopped process too
    check(code == 1, "node b fails with exit code 1 (got %s)" % code)
    stopped_answering(b, t.endpoint())
    t.wait_for("node b's workers gone", lambda: not any(pid_alive(p) for p in workers), 10)


def store_host_thread_stalled(t):
    """The agent hosting the store stalls: its main thread (its io_context: forks, worker pipes,
    timers) is stopped for 2.7 s, 3x the keep-alive bound (0.3 s x 3), while its other threads
    run -- what forking guards under load did to it at 256 agents on 2 cores (docs/rendezvous.md,
    "The store host's thread"). The store runs on a thread of its own, so it answers every
    heartbeat meanwhile: neither agent says the store stopped answering, and the job finishes
    (exit 0 on both). With the store on the agent's io_context, b declared it lost in ~1 s."""
    gate = os.path.join(t.dir, "finish")
    a = t.agent("a", "127.0.0.2", "2", "stalled", ["--exit-when", gate])
    b = t.agent("b", "127.0.0.3", "2", "stalled", ["--exit-when", gate])
    t.wait_for("a round of 2", lambda: len(t.starts()) == 2, 30)
    check("hosting the rendezvous store at " + t.endpoint() in a.stderr(),
          "a hosts the store: %s" % a.stderr()[-400:])
    main = a.proc.pid  # its main thread's id is the process id
    try:
        with stopped_thread(main):
            tasks = [int(x) for x in os.listdir("/proc/%d/task" % main)]
            states = {tid: thread_state(main, tid) for tid in tasks}
            check(states[main] == "t", "a's main thread is stopped (state %s)" % states[main])
            check(all(s != "t" for tid, s in states.items() if tid != main),
                  "a's other threads run: %s" % states)
            time.sleep(2.7)
            check(b.proc.poll() is None and a.proc.poll() is None,
                  "both agents still run after 2.7 s of a's main thread stopped: b %s, a %s; "
                  "b: %s" % (b.proc.poll(), a.proc.poll(), b.stderr()[-600:]))
    except PtraceRefused as e:
        print("SKIP: cannot stop one thread of the agent: %s" % e)
        return SKIP
    open(gate, "w").close()
    check(a.wait(30) == 0, "a exits 0 (got %s): %s" % (a.proc.returncode, a.stderr()[-600:]))
    check(b.wait(30) == 0, "b exits 0 (got %s): %s" % (b.proc.returncode, b.stderr()[-600:]))
    for n in (a, b):
        err = n.stderr()
        check("stopped answering" not in err and "lost the rendezvous store" not in err,
              "%s did not lose the store: %s" % (n.name, err[-600:]))


def paused_agent_store_gone(t):
    """Agent b is paused (SIGSTOP) for longer than the keep-alive bound while the store host is
    killed; resumed, b fails naming the endpoint, and does not blame the store for its own
    pause: the store is gone (its connections refused), it did not stop answering."""
    a, b, workers = store_host_and_other(t, "pausedgone")
    b.signal(signal.SIGSTOP)
    try:
        a.signal(signal.SIGKILL)
        check(a.wait(30) == -signal.SIGKILL, "the store host is gone")
        time.sleep(2.0)  # more than twice the keep-alive bound (0.9 s) of b's silence
    finally:
        b.signal(signal.SIGCONT)
    code = b.wait(30)
    err = b.stderr()
    check(code == 1, "node b fails with exit code 1 (got %s)" % code)
    check(t.endpoint() in err, "its message names the endpoint %s: %s" % (t.endpoint(), err[-600:]))
    print("node b: " + next((l for l in err.splitlines() if " E " in l), ""))
    check("stopped answering" not in err,
          "b does not say the store stopped answering: b was the one paused: %s" % err[-600:])
    t.wait_for("node b's workers gone", lambda: not any(pid_alive(p) for p in workers), 10)


def store_frozen(t):
    """A standalone ddprun-store is stopped (SIGSTOP): every agent of the job reports it, by its
    address, as a store that stopped answering."""
    store, ep = standalone_store()
    try:
        nodes = [t.agent(name, addr, "2", "frozenstore", ["--finish-at-world", "99"], endpoint=ep)
                 for name, addr in (("a", "127.0.0.2"), ("b", "127.0.0.3"))]
        t.wait_for("a round of 2", lambda: len(t.starts()) == 2, 30)
        store.send_signal(signal.SIGSTOP)
        for n in nodes:
            check(n.wait(60) == 1, "node %s exit code %s" % (n.name, n.proc.returncode))
    finally:
        store.kill()
        store.wait()
    for n in nodes:
        stopped_answering(n, ep)


def sigterm_leave(t):
    """SIGTERM to one agent: that node leaves cleanly; the others re-form without it."""
    gate = os.path.join(t.dir, "gate")  # an early round of 2 (MIN=1) must not end the job
    nodes = [t.agent(n, addr, "1:3", "leave", ["--finish-at-world", "2", "--gate", gate])
             for n, addr in (("a", "127.0.0.2"), ("b", "127.0.0.3"), ("c", "127.0.0.4"))]
    t.wait_for("a round of 3", lambda: len(t.starts(world=3)) == 3, 30)
    open(gate, "w").close()
    signalled = time.time()
    nodes[2].signal(signal.SIGTERM)
    check(nodes[2].wait(30) == 128 + signal.SIGTERM,
          "c exits 143 (got %s)" % nodes[2].proc.returncode)
    for n in nodes[:2]:
        check(n.wait(60) == 0, "node %s exit code %s" % (n.name, n.proc.returncode))
    check(sorted(r["node"] for r in t.starts(world=2, after=signalled)) == ["a", "b"],
          "a and b go on as 2")
    check(any("left" in n.stderr() for n in nodes[:2]), "the departure is logged")


def static_backend(t):
    """--rdzv-backend=static: ranks are the --node-rank values; node 0 hosts the store."""
    def rdzv(rank):
        return ["--rdzv-backend=static", "--node-rank=%d" % rank, "--master-addr=127.0.0.3",
                "--master-port=%d" % t.port]
    a = t.agent("a", "127.0.0.2", "2", "", ["--run", "0.2"], rdzv=rdzv(1))
    b = t.agent("b", "127.0.0.3", "2", "", ["--run", "0.2"], rdzv=rdzv(0))
    check(a.wait(60) == 0 and b.wait(60) == 0, "both exit 0 (%s, %s)" % (a.proc.returncode,
                                                                        b.proc.returncode))
    check(group_ranks(t, "a") == [1] and group_ranks(t, "b") == [0], "ranks from --node-rank")
    check(all(r["MASTER_ADDR"] == "127.0.0.3" for r in t.starts()), "master is node 0")


TORCH_PYTHON = os.environ.get("DDPRUN_TORCH_PYTHON") or "/usr/bin/python3"


def torch_gloo_elastic(t):
    """Real PyTorch workers (gloo, env://, the agent store): a node arriving mid-run re-forms
    the world with TORCHELASTIC_RESTART_COUNT still 0 -- the same /worker/attempt_0 keys a
    shared store would still hold from the round before (pytorch#135712); each round's fresh
    worker store keeps the second init_process_group clean. The all-reduce crosses nodes."""
    if subprocess.run([TORCH_PYTHON, "-c", "import torch.distributed"],
                      capture_output=True).returncode != 0:
        return skip_unless_ci("%s has no torch (Debian's python3-torch)" % TORCH_PYTHON)
    import harness
    env = {"PYTHON_EXEC": TORCH_PYTHON}
    conf = FAST_CONF.replace("last_call_timeout=0.5", "last_call_timeout=0.2")
    worker = os.path.join(harness.HERE, "torch_worker.py")

    def node(name, addr):
        args = ["--nnodes=1:2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                "--rdzv-endpoint=%s" % t.endpoint(), "--rdzv-id=torch",
                "--local-addr=%s" % addr, "--rdzv-conf=%s" % conf, worker,
                "--out", os.path.join(t.out, name), "--finish-at-world", "4"]
        return harness.Node(t, name, args, env=env)
    a = node("a", "127.0.0.2")
    t.wait_for("a world of 2 on node a", lambda: len(t.starts(world=2)) == 2, 60)
    b = node("b", "127.0.0.3")
    check(a.wait(90) == 0, "node a exit code %s" % a.proc.returncode)
    check(b.wait(90) == 0, "node b exit code %s" % b.proc.returncode)
    four = t.starts(world=4)
    check(len(four) == 4, "4 torch workers in the world of 4 (got %d)" % len(four))
    for r in t.starts():
        check(r["sum"] == r["expected"], "all_reduce across nodes: %s" % r)
        check(r["TORCHELASTIC_RESTART_COUNT"] == "0", "membership changes spend no restart")
        check(r["TORCHELASTIC_USE_AGENT_STORE"] == "True", "workers use the agent store")
    check(sorted(r["node"] for r in four) == ["a", "a", "b", "b"], "two workers per node")


def netns_two_nodes(t):
    """Two nodes in two network namespaces joined by a veth pair: each has a real address of
    its own, found by ddprun itself (no --local-addr), and the endpoint uses the default port."""
    if os.geteuid() != 0:
        print("SKIP: needs root to create network namespaces (running as uid %d)" % os.geteuid())
        return SKIP
    tag = "%d" % (os.getpid() % 100000)
    ns = ["ddprun-mn-%s-a" % tag, "ddprun-mn-%s-b" % tag]
    addrs = ["10.213.7.1", "10.213.7.2"]
    setup = [["ip", "netns", "add", ns[0]], ["ip", "netns", "add", ns[1]],
             ["ip", "link", "add", "dda" + tag, "netns", ns[0], "type", "veth",
              "peer", "name", "ddb" + tag, "netns", ns[1]]]
    for i, dev in enumerate(("dda" + tag, "ddb" + tag)):
        setup += [["ip", "-n", ns[i], "addr", "add", addrs[i] + "/24", "dev", dev],
                  ["ip", "-n", ns[i], "link", "set", dev, "up"],
                  ["ip", "-n", ns[i], "link", "set", "lo", "up"]]
    try:
        for cmd in setup:
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                print("SKIP: `%s` failed: %s" % (" ".join(cmd), r.stderr.strip()))
                return SKIP
        ep = addrs[0]  # no port: ddprun's default, 29400
        a = t.agent("a", None, "2", "netns", ["--run", "0.2"], endpoint=ep,
                    prefix=["ip", "netns", "exec", ns[0]])
        b = t.agent("b", None, "2", "netns", ["--run", "0.2"], endpoint=ep,
                    prefix=["ip", "netns", "exec", ns[1]])
        check(a.wait(60) == 0, "node a exit code %s" % a.proc.returncode)
        check(b.wait(60) == 0, "node b exit code %s" % b.proc.returncode)
        check("hosting the rendezvous store" in a.stderr(),
              "node a hosts (its address is the endpoint)")
        check_round(t.starts(), {"a": addrs[0], "b": addrs[1]})
    finally:
        t.cleanup()
        for n in ns:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


def shm_hierarchical(t):
    """Two nodes of two ranks (agents on 127.0.0.2 and 127.0.0.3, one machine): under
    DDPRUN_TRANSPORT=auto each node's ranks share memory and the leaders talk TCP (the
    hierarchical allreduce; a node is a GROUP_RANK, so two agents on one host are two nodes).
    runtime_mp_worker collectives-small checks every op and dtype on sizes 1, odd and 3 MiB
    against the exact reference on every rank (so all ranks hold the same bits), and broadcast
    and allgather; no segment is left in /dev/shm."""
    worker = os.path.join(BIN, "runtime_mp_worker")
    check(os.access(worker, os.X_OK), "%s is built" % worker)
    prefix = "ddprun-hier-%d" % os.getpid()
    env = {"DDPRUN_TRANSPORT": "auto", "DDPRUN_SHM_PREFIX": prefix}
    nodes = []
    for name, addr in (("a", "127.0.0.2"), ("b", "127.0.0.3")):
        args = ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                "--rdzv-endpoint=%s" % t.endpoint(), "--rdzv-id=hier", "--local-addr=%s" % addr,
                "--rdzv-conf=%s" % FAST_CONF, worker, "collectives-small"]
        nodes.append(Node(t, name, args, env=env))
    for n in nodes:
        check(n.wait(120) == 0, "node %s exit code %s" % (n.name, n.proc.returncode))
    out = "".join(n.stdout() + n.stderr() for n in nodes)
    for r in range(4):
        check("rank %d/4 collectives-small OK" % r in out, "rank %d printed its OK line" % r)
    check("MISMATCH" not in out, "no mismatch")
    check("backend shm+tcp" in out, "rank 0's communicator is the hierarchical one (shm+tcp)")
    check("hierarchical" in out, "rank 0 logged the hierarchical transport choice")
    left = [f for f in os.listdir("/dev/shm") if f.startswith(prefix)]
    check(not left, "nothing left in /dev/shm (found %s)" % left)


def read_trace(path):
    """A merged timeline and its track names by trace pid (docs/timeline.md)."""
    with open(path) as f:
        data = json.load(f)
    names = {e["pid"]: e["args"]["name"] for e in data["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    return data, names


def both_agents_trace(trace):
    """The merged timeline of the agents on 127.0.0.2 and 127.0.0.3, checked to hold both
    agents' tracks and to name no node missing: its track names by trace pid, and its events
    (metadata left out) by track name."""
    data, names = read_trace(trace)
    check(sorted(names.values()) == ["agent 127.0.0.2", "agent 127.0.0.3"],
          "both agents' tracks: %s" % sorted(names.values()))
    check(data["otherData"]["nodes_missing"] == [], "no node missing: %s" % data["otherData"])
    by = {}
    for e in data["traceEvents"]:
        if e.get("ph") != "M":
            by.setdefault(names[e["pid"]], []).append(e)
    return names, by


def timeline_node_killed(t):
    """--timeline on three nodes (1:3) and node c's agent SIGKILLed mid-run: a and b re-form
    and finish; node rank 0's agent writes one trace holding both survivors' agents (the other
    one's events shipped through the store, with its clock offset and bound stated: 0 within the
    bound, one machine); c's events, never shipped, are absent, and nothing fails
    (docs/timeline.md)."""
    trace = os.path.join(t.dir, "job.json")
    gate = os.path.join(t.dir, "gate")  # an early round of 2 (MIN=1) must not end the job
    nodes = [t.agent(n, addr, "1:3", "tl-shrink", ["--finish-at-world", "2", "--gate", gate],
                     extra=["--timeline=" + trace])
             for n, addr in (("a", "127.0.0.2"), ("b", "127.0.0.3"), ("c", "127.0.0.4"))]
    t.wait_for("a round of 3", lambda: len(t.starts(world=3)) == 3, 30)
    open(gate, "w").close()
    nodes[2].signal(signal.SIGKILL)
    for n in nodes[:2]:
        check(n.wait(60) == 0, "node %s exit code %s" % (n.name, n.proc.returncode))
    data, names = read_trace(trace)
    check(sorted(names.values()) == ["agent 127.0.0.2", "agent 127.0.0.3"],
          "the survivors' agents, not the killed one's: %s" % sorted(names.values()))
    other = data["otherData"]
    check(other["nodes_missing"] == [], "no node of the last round missing: %s" % other)
    info = {tr["track"]: tr for tr in other["tracks"]}
    writer = [n for n, tr in info.items() if tr["clock_offset_bound_us"] == 0]
    check(len(writer) == 1, "one agent is the reference clock: %s" % info)
    shipped = info[({"agent 127.0.0.2", "agent 127.0.0.3"} - set(writer)).pop()]
    bound = shipped["clock_offset_bound_us"]
    check(isinstance(bound, int) and bound > 0 and abs(shipped["clock_offset_us"]) <= bound,
          "the shipped node's offset is 0 within its bound (one machine): %s" % shipped)
    check(other["clock_offset_bound_us"] == bound, "the file states the bound")
    pid = {v: k for k, v in names.items()}[shipped["track"]]
    rounds = [e for e in data["traceEvents"] if e.get("pid") == pid and e["name"] == "rendezvous"]
    check(sorted(e["args"]["nodes"] for e in rounds)[-2:] == [2, 3],
          "the shipped agent's rounds of 3 and then 2 nodes are there: %s" %
          [e["args"] for e in rounds])


def timeline_job_failed(t):
    """--timeline on two nodes whose job fails (node rank 1's worker exits 7, no restart left):
    node rank 1's agent ships its events when the job ends and node rank 0's agent waits for
    them, so the one file holds its failed worker, its failure report and both agents' job end
    (which node holds node rank 1 is read from the workers' records: arrival order)."""
    trace = os.path.join(t.dir, "job.json")
    args = ["--always-fail", "1", "7", "--run", "30"]
    a = t.agent("a", "127.0.0.2", "2", "tl-fail", args,
                extra=["--max-restarts=0", "--timeline=" + trace])
    b = t.agent("b", "127.0.0.3", "2", "tl-fail", args,
                extra=["--max-restarts=0", "--timeline=" + trace])
    for n in (a, b):
        check(n.wait(60) == 7, "node %s exit code %s, expected 7" % (n.name, n.proc.returncode))
    names, by = both_agents_trace(trace)
    failing = [r["node"] for r in t.starts() if r["GROUP_RANK"] == "1"]
    check(len(failing) == 1, "one node rank 1: %s" % failing)
    addr = {"a": "127.0.0.2", "b": "127.0.0.3"}[failing[0]]
    b_events = by["agent " + addr]
    failed = [e for e in b_events if e["name"] == "worker exit" and e["args"]["failed"] == 1]
    check(len(failed) == 1 and failed[0]["args"]["result"] == "exit code 7",
          "node rank 1's (%s) failed worker arrived through the store: %s" % (failing[0], failed))
    check(any(e["name"] == "failure report" for e in b_events), "node rank 1's failure report")
    for n in names.values():
        check(any(e["name"] == "job end" and e["args"]["exit_code"] == 7 for e in by[n]),
              "%s: job end with exit code 7" % n)


def timeline_sigterm(t):
    """--timeline on two nodes and the job cancelled (SIGTERM to both agents at once, as a
    scheduler does): each stops its workers and leaves with 143; node b's agent ships its events
    on the way out and node rank 0's agent waits (a bounded while) for them, so the one file holds
    both agents' stopped workers and job ends (docs/timeline.md). The rendezvous store is on b
    (the endpoint's host) and a is node rank 0: b must keep its store up until a has read b's
    bundle, though it is leaving too. With --rdzv-conf rank_order=stable, so that a (the lower
    address) is node rank 0 every time: in arrival order (the default) b, which hosts the store,
    is often first, and the case this scenario is for would not be tested."""
    trace = os.path.join(t.dir, "job.json")
    nodes = [t.agent(n, addr, "2", "tl-term", ["--run", "60"], extra=["--timeline=" + trace],
                     endpoint=t.endpoint("127.0.0.3"), conf=STABLE_CONF)
             for n, addr in (("a", "127.0.0.2"), ("b", "127.0.0.3"))]
    cancel_and_check_trace(t, nodes, trace, writer="a")


def timeline_sigterm_writer_only(t):
    """--timeline on two nodes, SIGTERM to node rank 0's agent only: the other node goes on, so
    its bundle never comes; the writer's wait for it is bounded, it exits 143 with a trace of its
    own node that names the other missing (docs/timeline.md)."""
    trace = os.path.join(t.dir, "job.json")
    nodes = {n: t.agent(n, addr, "2", "tl-term1", ["--run", "60"], extra=["--timeline=" + trace])
             for n, addr in (("a", "127.0.0.2"), ("b", "127.0.0.3"))}
    starts = t.wait_for("both workers", lambda: len(t.starts(world=2)) == 2 and t.starts(), 30)
    writer = [r["node"] for r in starts if r["GROUP_RANK"] == "0"][0]
    nodes[writer].signal(signal.SIGTERM)
    check(nodes[writer].wait(60) == 128 + signal.SIGTERM, "the writer exits 143 (got %s)" %
          nodes[writer].proc.returncode)
    data, names = read_trace(trace)
    check(sorted(names.values()) == ["agent 127.0.0.%d" % (2 if writer == "a" else 3)],
          "the writer's own agent only: %s" % sorted(names.values()))
    check(data["otherData"]["nodes_missing"] == ["node rank 1"],
          "the node that went on is named missing: %s" % data["otherData"]["nodes_missing"])


def cancel_and_check_trace(t, nodes, trace, writer=None):
    """timeline_sigterm's SIGTERM to both agents and its checks of the one file; `writer`: the
    node that must be node rank 0 (the trace's writer), or None for either."""
    t.wait_for("both workers", lambda: len(t.starts(world=2)) == 2, 30)
    if writer:
        check([r["node"] for r in t.starts() if r["GROUP_RANK"] == "0"] == [writer],
              "%s is node rank 0, the trace's writer" % writer)
    for n in nodes:
        n.signal(signal.SIGTERM)
    for n in nodes:
        check(n.wait(60) == 128 + signal.SIGTERM, "node %s exit code %s, expected 143" %
              (n.name, n.proc.returncode))
    names, by = both_agents_trace(trace)
    for n in names.values():
        stopped = [e for e in by[n] if e["name"] == "worker exit"]
        check(len(stopped) == 1 and stopped[0]["args"]["stopped_by_ddprun"] == 1,
              "%s: its worker stopped by ddprun: %s" % (n, stopped))
        check(any(e["name"] == "job end" and e["args"]["exit_code"] == 143 for e in by[n]),
              "%s: job end with exit code 143" % n)


SCENARIOS = {f.__name__: f for f in (
    fixed_two_nodes, join_mid_run, join_mid_run_stable, kill_agent, kill_agent_stable,
    worker_failure, failure_ends_job, not_retryable, paused_node_while_finishing, two_jobs,
    wrong_store, store_host_lost, store_host_lost_in_exit_barrier,
    store_host_frozen_in_exit_barrier, store_host_frozen, store_host_thread_stalled, store_frozen,
    paused_agent_store_gone, sigterm_leave, static_backend, torch_gloo_elastic,
    netns_two_nodes, shm_hierarchical, timeline_node_killed, timeline_job_failed,
    timeline_sigterm, timeline_sigterm_writer_only)}

if __name__ == "__main__":
    sys.exit(run(SCENARIOS))
