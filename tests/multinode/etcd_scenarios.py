"""Multi-node scenarios on etcd (--rdzv-backend=etcd-v3): each starts its own 3-member etcd
cluster (Debian's etcd-server) on free loopback ports, with data directories in the test's
temporary directory, and real ddprun agents on 127.0.0.x addresses. The cluster keeps etcd's
default timing (election timeout 1 s), so a leader's loss costs what it costs in production.
Usage: etcd_scenarios.py NAME (exit 0 pass, 1 fail, 77 skip: etcd not installed)."""
import json
import os
import signal
import subprocess
import sys
import time

import harness
from etcd_cluster import EtcdCluster, installed
from harness import SKIP, check, pid_alive, run, skip_unless_ci
from scenarios import cancel_and_check_trace, check_round, ranks_in

# lease_ttl 5 s: a lost agent is evicted 5 s after its last keepalive, and the lease still
# outlasts an election (1-3 s with etcd's defaults).
LEASE_TTL = 5.0
CONF = "lease_ttl=5,read_timeout=10,last_call_timeout=0.5,join_timeout=60,close_timeout=5," \
       "exit_barrier_timeout=60"
# Scenarios where etcd itself loses members use the default lease (10 s): the job must ride out
# an election even on a busy machine.
CONF_DEFAULT_LEASE = CONF.replace("lease_ttl=5", "lease_ttl=10")
TORCH_PYTHON = os.environ.get("DDPRUN_TORCH_PYTHON") or "/usr/bin/python3"


def start_cluster(t):
    os.makedirs(os.path.join(t.dir, "etcd"))
    t.etcd = EtcdCluster(os.path.join(t.dir, "etcd"))
    t.cleanups.append(t.etcd.stop)
    return t.etcd


def etcd_agent(t, name, addr, nnodes, rdzv_id, worker_args, conf=CONF, **kw):
    rdzv = ["--rdzv-backend=etcd-v3", "--rdzv-endpoint=%s" % t.etcd.endpoints(),
            "--rdzv-id=%s" % rdzv_id]
    return t.agent(name, addr, nnodes, rdzv_id, worker_args, conf=conf, rdzv=rdzv, **kw)


def etcd_train(t):
    """(a) Two nodes form on etcd and train the real mnist_mlp (Fashion-MNIST slice, gloo);
    both exit 0, rank 0's metrics show a world of 2 that learned something."""
    start_cluster(t)
    metrics = os.path.join(t.dir, "metrics.jsonl")
    trainer = [os.path.join(harness.BIN, "mnist_mlp"), "--train-limit", "4096",
               "--test-limit", "1000", "--batch-size", "32", "--epochs", "1", "--seed", "11",
               "--log-interval", "32", "--metrics", metrics,
               "--checkpoint-dir", os.path.join(t.dir, "ckpt")]
    nodes = []
    for name, addr in (("a", "127.0.0.2"), ("b", "127.0.0.3")):
        args = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=etcd-v3",
                "--rdzv-endpoint=%s" % t.etcd.endpoints(), "--rdzv-id=train",
                "--local-addr=%s" % addr, "--rdzv-conf=%s" % CONF] + trainer
        nodes.append(harness.Node(t, name, args))
    for n in nodes:
        check(n.wait(120) == 0, "node %s exit code %s" % (n.name, n.proc.returncode))
    with open(metrics) as f:
        summary = [json.loads(line) for line in f if '"summary"' in line][-1]
    check(summary["world_size"] == 2 and summary["steps"] == 64, "a world of 2: %s" % summary)
    check(summary["test_accuracy"] > 0.6, "it learned: %s" % summary)
    check("etcd-v3 rendezvous 'train'" in nodes[0].stderr(), "the etcd backend was used")


def etcd_torch_ddp(t):
    """(a) A PyTorch DDP script (Debian's torch 1.13, gloo, env://) across two nodes that met
    on etcd: the workers' store is the one node rank 0's agent hosts."""
    if subprocess.run([TORCH_PYTHON, "-c", "import torch.distributed"],
                      capture_output=True).returncode != 0:
        return skip_unless_ci("%s has no torch (Debian's python3-torch)" % TORCH_PYTHON)
    start_cluster(t)
    script = os.path.join(harness.HERE, "..", "launcher", "workers", "ddp_train.py")
    nodes = []
    for name, addr in (("a", "127.0.0.2"), ("b", "127.0.0.3")):
        args = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=etcd-v3",
                "--rdzv-endpoint=%s" % t.etcd.endpoints(), "--rdzv-id=torch",
                "--local-addr=%s" % addr, "--rdzv-conf=%s" % CONF, script,
                "--checkpoint", os.path.join(t.dir, "ckpt-%s.pt" % name), "--epochs", "2"]
        nodes.append(harness.Node(t, name, args, env={"PYTHON_EXEC": TORCH_PYTHON}))
    for n in nodes:
        check(n.wait(120) == 0, "node %s exit code %s" % (n.name, n.proc.returncode))
    # Node ranks in arrival order (the default): rank 0 is whichever node took the first slot.
    rank0 = [n.name for n in nodes if "[rank 0]:" in n.stdout()]
    check(len(rank0) == 1, "one node runs rank 0: %s" % rank0)
    check(os.path.exists(os.path.join(t.dir, "ckpt-%s.pt" % rank0[0])),
          "rank 0 (node %s) saved its checkpoint" % rank0[0])



def etcd_timeline_sigterm(t):
    """--timeline on two nodes that met on etcd, both agents SIGTERMed mid-run (a cancelled job):
    node b ships its events through the workers' store node rank 0's agent hosts, which waits
    for them before it leaves: one file with both agents' stopped workers and job ends."""
    start_cluster(t)
    trace = os.path.join(t.dir, "job.json")
    nodes = [etcd_agent(t, n, addr, "2", "tlterm", ["--run", "60"], extra=["--timeline=" + trace])
             for n, addr in (("a", "127.0.0.2"), ("b", "127.0.0.3"))]
    cancel_and_check_trace(t, nodes, trace)

def etcd_leader_killed(t):
    """(b) kill -9 of the etcd leader mid-job: the job never notices -- one round, no restart,
    every node exits 0 after its workers' full run."""
    etcd = start_cluster(t)
    nodes = [etcd_agent(t, n, addr, "3", "leader", ["--run", "8"], conf=CONF_DEFAULT_LEASE)
             for n, addr in (("a", "127.0.0.2"), ("b", "127.0.0.3"), ("c", "127.0.0.4"))]
    t.wait_for("a round of 3", lambda: len(t.starts(world=3)) == 3, 60)
    leader = etcd.leader()
    check(leader >= 0, "the cluster has a leader")
    etcd.kill(leader)
    killed = time.time()
    for n in nodes:
        check(n.wait(60) == 0, "node %s exit code %s" % (n.name, n.proc.returncode))
    check(len(t.starts()) == 3, "one worker start per node: nobody restarted (%d starts)"
          % len(t.starts()))
    print("leader m%d killed; the job ended %.1f s later, untouched"
          % (leader, time.time() - killed))
    check(etcd.leader() not in (-1, leader), "the other two elected a new leader")


def etcd_store_host_killed(t):
    """(c) kill -9 of the agent whose node hosts the workers' store (node rank 0): its lease
    expires, the survivors re-form in a smaller world within lease_ttl + a small bound, a new
    node rank 0 hosts the workers' store, and they finish."""
    start_cluster(t)
    gate = os.path.join(t.dir, "gate")  # an early round of 2 must not end the job
    nodes = {n: etcd_agent(t, n, addr, "2:3", "host", ["--finish-at-world", "2", "--gate", gate])
             for n, addr in (("a", "127.0.0.2"), ("b", "127.0.0.3"), ("c", "127.0.0.4"))}
    t.wait_for("a round of 3", lambda: len(t.starts(world=3)) == 3, 60)
    three = t.starts(world=3)
    host = [r["node"] for r in three if r["GROUP_RANK"] == "0"][0]
    host_addr = three[0]["MASTER_ADDR"]
    victim_workers = [r["pid"] for r in t.starts(node=host)]
    open(gate, "w").close()
    killed = time.time()
    os.killpg(nodes[host].proc.pid, signal.SIGKILL)
    survivors = [n for name, n in nodes.items() if name != host]
    for n in survivors:
        check(n.wait(60) == 0, "node %s exit code %s" % (n.name, n.proc.returncode))
    two = t.starts(world=2, after=killed)
    check(sorted(r["node"] for r in two) == sorted(n.name for n in survivors),
          "the survivors form the world of 2: %s" % two)
    took = min(r["started"] for r in two) - killed
    print("node %s (the workers' store host, %s) killed; the survivors' workers started "
          "%.2f s later (lease_ttl %.0f s)" % (host, host_addr, took, LEASE_TTL))
    check(took < LEASE_TTL + 3.0, "re-formed within lease_ttl + 3 s (took %.1f)" % took)
    check(all(r["MASTER_ADDR"] != host_addr for r in two), "another node hosts the workers' store")
    check(not any(pid_alive(p) for p in victim_workers), "the killed node's workers are gone")
    check(any("etcd lease expired" in n.stderr() for n in survivors), "eviction logged")


def etcd_quorum_lost(t):
    """(d) Two of three members killed: every agent fails within a bound with a message naming
    etcd and every endpoint, and stops its workers; nothing hangs."""
    etcd = start_cluster(t)
    nodes = [etcd_agent(t, n, addr, "3", "quorum", ["--finish-at-world", "99"])
             for n, addr in (("a", "127.0.0.2"), ("b", "127.0.0.3"), ("c", "127.0.0.4"))]
    t.wait_for("a round of 3", lambda: len(t.starts(world=3)) == 3, 60)
    workers = [r["pid"] for r in t.starts()]
    etcd.kill(0)
    etcd.kill(1)
    killed = time.time()
    # A keepalive every ttl/3 that fails for ttl, then the agent stops: a bound that only
    # catches hangs (typically ~9 s here).
    bound = LEASE_TTL / 3 + LEASE_TTL + 10.0
    for n in nodes:
        code = n.wait(bound + 10)
        check(code == 1, "node %s exits 1 (got %s)" % (n.name, code))
    took = time.time() - killed
    print("every agent failed %.1f s after the quorum was lost (bound %.1f s)" % (took, bound))
    check(took < bound, "within %.1f s (took %.1f)" % (bound, took))
    for n in nodes:
        err = n.stderr()
        check("etcd at" in err and all(ep in err for ep in t.etcd.endpoints().split(",")),
              "node %s names etcd and every endpoint: %s" % (n.name, err[-400:]))
    t.wait_for("every worker stopped", lambda: not any(pid_alive(p) for p in workers), 10)


def etcd_two_jobs(t):
    """(e) Two jobs on one etcd cluster never see each other: each forms its own world of 2,
    keeps its keys under its own id (job y under another key_prefix), and one job's node
    dying does not disturb the other."""
    etcd = start_cluster(t)
    other = CONF + ",key_prefix=/elsewhere/jobs"
    gate = os.path.join(t.dir, "gate")
    x = [etcd_agent(t, n, addr, "1:2", "jobx", ["--finish-at-world", "1", "--gate", gate])
         for n, addr in (("x1", "127.0.0.2"), ("x2", "127.0.0.3"))]
    y = [etcd_agent(t, n, addr, "2", "joby", ["--run", "6"], conf=other)
         for n, addr in (("y1", "127.0.0.4"), ("y2", "127.0.0.5"))]
    t.wait_for("both worlds of 2", lambda: len(t.starts(world=2)) == 4, 60)
    keys_x = etcd.get_prefix("/ddprun/rdzv/")
    keys_y = etcd.get_prefix("/elsewhere/jobs/")
    check(keys_x and all(k.startswith("/ddprun/rdzv/jobx/") for k in keys_x),
          "job x's keys only under /ddprun/rdzv/jobx/: %s" % keys_x)
    check(keys_y and all(k.startswith("/elsewhere/jobs/joby/") for k in keys_y),
          "job y's keys only under its key_prefix: %s" % keys_y)
    open(gate, "w").close()
    os.killpg(x[1].proc.pid, signal.SIGKILL)  # job x shrinks to 1 and finishes
    check(x[0].wait(60) == 0, "x1 exit code %s" % x[0].proc.returncode)
    for n in y:
        check(n.wait(60) == 0, "node %s exit code %s" % (n.name, n.proc.returncode))
    # Job y's round is its own two nodes (in arrival order: node rank 0 either of them).
    ys = [r for n in ("y1", "y2") for r in t.starts(node=n)]
    check(len(ys) == 2 and all(r["WORLD_SIZE"] == "2" and r["TORCHELASTIC_RUN_ID"] == "joby"
                               for r in ys), "y1 and y2 belong to joby only: %s" % ys)
    check_round(ys, {"y1": "127.0.0.4", "y2": "127.0.0.5"})
    check(all(r["TORCHELASTIC_RUN_ID"] == "jobx" and r["MASTER_ADDR"] in ("127.0.0.2", "127.0.0.3")
              for r in t.starts(node="x1")), "x1 saw only job x")


def etcd_member_restarted(t):
    """(f) A member killed and restarted mid-job rejoins the cluster; with another member then
    down, the cluster's quorum rests on the restarted one, and the job goes on: a node
    arriving re-forms the world through it and the job finishes."""
    etcd = start_cluster(t)
    nodes = [etcd_agent(t, n, addr, "2:3", "restart", ["--finish-at-world", "3"],
                        conf=CONF_DEFAULT_LEASE)
             for n, addr in (("a", "127.0.0.2"), ("b", "127.0.0.3"))]
    t.wait_for("a round of 2", lambda: len(t.starts(world=2)) == 2, 60)
    follower = [i for i in range(3) if i != etcd.leader()][0]
    etcd.kill(follower)
    time.sleep(1.0)
    etcd.start(follower)  # same data directory: it rejoins
    t.wait_for("member m%d serving again" % follower,
               lambda: etcd.alive(follower) and _serves(etcd, follower), 30)
    other = [i for i in range(3) if i != follower and i != etcd.leader()]
    victim = other[0] if other else [i for i in range(3) if i != follower][0]
    etcd.kill(victim)  # quorum is now the restarted member plus one
    nodes.append(etcd_agent(t, "c", "127.0.0.4", "2:3", "restart", ["--finish-at-world", "3"],
                            conf=CONF_DEFAULT_LEASE))
    for n in nodes:
        check(n.wait(60) == 0, "node %s exit code %s" % (n.name, n.proc.returncode))
    check(len(t.starts(world=3)) == 3, "the world grew to 3 after the restart")
    check(all(r["TORCHELASTIC_RESTART_COUNT"] == "0" for r in t.starts()), "no restart spent")


def _serves(etcd, i):
    try:
        s = etcd.status(i)
    except OSError:
        return False
    return bool(s.get("leader"))


def descendants(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir("/proc/%d/task" % p):
                with open("/proc/%d/task/%s/children" % (p, task)) as f:
                    kids = [int(x) for x in f.read().split()]
                out += kids
                todo += kids
        except OSError:
            pass
    return out


def environ(pid):
    """The environment /proc shows for `pid` ({} when it is gone)."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(i.decode(errors="replace").split("=", 1) for i in items if b"=" in i)


def comm(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return ""


def etcd_node_loss(t):
    """(a) A lost node recovered in process on etcd (docs/recovery.md#a-lost-node): three agents
    (one mnist_mlp rank each, --recovery-policy=shrink); node rank 1's agent and worker SIGKILLed
    once step 20 is checkpointed: its lease expires, it is evicted as lost in process, node
    rank 0's agent removes its rank, and the workers of node ranks 0 and 2 keep their processes.
    Node ranks are in arrival order (the default): read from each worker's GROUP_RANK."""
    start_cluster(t)
    ckpt = os.path.join(t.dir, "ckpt")
    trainer = [os.path.join(harness.BIN, "mnist_mlp"), "--train-limit", "4096",
               "--test-limit", "1000", "--batch-size", "16", "--epochs", "2", "--seed", "11",
               "--log-interval", "32", "--checkpoint-dir", ckpt, "--checkpoint-interval", "10"]
    conf = CONF.replace("last_call_timeout=0.5", "last_call_timeout=20").replace(
        "lease_ttl=5", "lease_ttl=2")
    nodes = []
    for name, addr in (("a", "127.0.0.2"), ("b", "127.0.0.3"), ("c", "127.0.0.4")):
        args = ["--nnodes=2:3", "--nproc-per-node=1", "--rdzv-backend=etcd-v3",
                "--rdzv-endpoint=%s" % t.etcd.endpoints(), "--rdzv-id=loss",
                "--local-addr=%s" % addr, "--rdzv-conf=%s" % conf, "--max-restarts=1",
                "--recovery=in-process", "--recovery-policy=shrink"] + trainer
        nodes.append(harness.Node(t, name, args))

    def checkpointed():
        try:
            return any(int(f[5:-6]) >= 20 for f in os.listdir(ckpt)
                       if f.startswith("ckpt-") and f.endswith(".ddpck"))
        except (OSError, ValueError):
            return False
    t.wait_for("the checkpoint of step 20", checkpointed, 120)
    by_rank = {}
    for n in nodes:
        for p in descendants(n.proc.pid):
            if comm(p) == "mnist_mlp":
                by_rank[int(environ(p).get("GROUP_RANK", "-1"))] = n
    check(sorted(by_rank) == [0, 1, 2], "one node per node rank: %s" %
          {k: n.name for k, n in by_rank.items()})
    print("node ranks 0, 1, 2: %s" % [by_rank[k].name for k in range(3)])
    a, b, c = by_rank[0], by_rank[1], by_rank[2]
    survivors = {n.name: [p for p in descendants(n.proc.pid) if comm(p) == "mnist_mlp"]
                 for n in (a, c)}
    victims = [p for p in descendants(b.proc.pid) if comm(p) == "mnist_mlp"]
    check(all(len(v) == 1 for v in survivors.values()) and len(victims) == 1,
          "one worker per node: %s, %s" % (survivors, victims))
    b.signal(signal.SIGKILL)
    for p in victims:
        os.kill(p, signal.SIGKILL)
    for n in (a, c):
        check(n.wait(120) == 0, "node %s exit code %s" % (n.name, n.proc.returncode))
    out_a, out_c = a.stdout() + a.stderr(), c.stdout() + c.stderr()
    check("recovering in process (generation 1): its rank(s) 1 are removed, the group shrinks "
          "from 3 to 2 rank(s)" in out_a, "node rank 0's agent removed the lost node's rank")
    check("as rank 1 of 2 (was rank 2 of 3; the group shrank)" in out_c,
          "node rank 2's worker kept its process, renumbered 2 -> 1")
    check("restarting the workers" not in out_a + out_c, "no group restarted")
    check("rank 0 recovered in process in" in out_a, "node rank 0's worker kept its process")


SCENARIOS = {f.__name__: f for f in (
    etcd_train, etcd_torch_ddp, etcd_leader_killed, etcd_store_host_killed, etcd_quorum_lost,
    etcd_two_jobs, etcd_member_restarted, etcd_timeline_sigterm, etcd_node_loss)}


def main():
    if not installed():
        return skip_unless_ci("etcd is not installed (Debian etcd-server; scripts/setup "
                              "installs it)")
    return run(SCENARIOS)


if __name__ == "__main__":
    sys.exit(main())
