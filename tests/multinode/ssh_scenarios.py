"""ddprun --hosts: one command starts an agent per host over ssh. The hosts are 127.0.0.2 and
127.0.0.3 served by a private sshd (ssh_hosts.py). Usage: ssh_scenarios.py NAME (0/1/77)."""
import json
import os
import signal
import time

from harness import BIN, SKIP, WORKER, Node, check, free_port, pid_alive, run, skip_unless_ci

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../..")
DATA = "/usr/share/datasets/fashion-mnist"


def pids_with(text):
    """Pids of live processes whose command line contains `text`."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % p, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd and pid_alive(int(p)):
            out.append(int(p))
    return out


def launch(t, hosts, name, args, extra=(), env=None):
    """The local ddprun with --hosts; its own run id so every process of it can be found."""
    e = dict(hosts.env, **(env or {}))
    run_id = "ssh-%s-%d" % (name, os.getpid())
    return Node(t, name, ["--hosts=%s" % ",".join("%s:2" % h for h in ("127.0.0.2", "127.0.0.3")),
                          "--rdzv-id=%s" % run_id, "--rdzv-conf=heartbeat=0.5,missed_heartbeats=4"]
                + list(extra) + args, env=e), run_id


def with_hosts(fn):
    def scenario(t):
        import ssh_hosts
        hosts = ssh_hosts.start(t.dir)
        if hosts is None:
            return SKIP
        try:
            return fn(t, hosts)
        finally:
            hosts.stop()
    scenario.__doc__ = fn.__doc__
    return scenario


@with_hosts
def train(t, hosts):
    """2 hosts x 2 workers train the bundled MLP (LibTorch, DDP over Gloo, Fashion-MNIST) and
    end 0; the remote agents' own lines come back marked with their host."""
    if not os.path.isdir(DATA):
        return skip_unless_ci("no Fashion-MNIST at %s (Debian's dataset-fashion-mnist)" % DATA)
    run_dir = os.path.join(t.dir, "run")
    metrics = os.path.join(run_dir, "metrics.jsonl")
    n, _ = launch(t, hosts, "train", [
        "--", os.path.join(BIN, "mnist_mlp"),
        "--config", os.path.join(SOURCE, "configs/mnist_mlp.json"),
        "--train-limit", "4096", "--test-limit", "1000", "--epochs", "1",
        "--checkpoint-dir", os.path.join(run_dir, "checkpoints"), "--metrics", metrics])
    rc = n.wait(120)
    check(rc == 0, "exit code %s" % rc)
    with open(metrics) as f:
        summary = [json.loads(l) for l in f if '"summary"' in l]
    check(len(summary) == 1, "one summary record")
    s = summary[0]
    print("summary: world %s, %s steps, final loss %.4f, test accuracy %.4f" %
          (s["world_size"], s["steps"], s["final_loss"], s["test_accuracy"]))
    check(s["world_size"] == 4 and s["steps"] == 16, "4 ranks, 4096 / (4 x 64) = 16 steps")
    check(s["test_accuracy"] > 0.5, "it learned (test accuracy %.3f)" % s["test_accuracy"])
    check(any(l.startswith("[node 0 rank 0]: ") and "test accuracy" in l
              for l in n.stdout().splitlines()), "rank 0's progress comes back as [node 0 rank 0]")
    check("[127.0.0.2]: " in n.stderr() and "[127.0.0.3]: " in n.stderr(),
          "the remote agents' own lines name their host")


@with_hosts
def worker_failure(t, hosts):
    """A worker failure on the second host: exit code 3, the host named in the report."""
    n, _ = launch(t, hosts, "fail", ["--", WORKER, "--out", os.path.join(t.out, "fail"),
                                     "--always-fail", "1", "3", "--run", "30"])
    rc = n.wait(60)
    check(rc == 3, "exit code %s (the root cause's, 3)" % rc)
    err = n.stderr()
    check("ddprun: the job failed on host 127.0.0.3: rank 2 (exit code 3) is the root cause "
          "-> ddprun exits with 3" in err, "the summary names host, rank and exit code")
    check("[127.0.0.3]: Root cause (first observed failure):" in err,
          "the remote failure report comes back, marked with its host")
    lines = n.stdout().splitlines()
    for rank in range(4):
        node = rank // 2
        check("[node %d rank %d]: worker rank %d of 4 started (node rank %d)"
              % (node, rank, rank, node) in lines,
              "rank %d's line comes back as [node %d rank %d]" % (rank, node, rank))


def _started_job(t, hosts, name, extra=()):
    n, run_id = launch(t, hosts, name, ["--", WORKER, "--out", os.path.join(t.out, name),
                                        "--finish-at-world", "99"], extra=extra)
    t.wait_for("4 workers running", lambda: len(t.starts(node=name)) == 4, 60)
    workers = [r["pid"] for r in t.starts(node=name)]
    agents = pids_with("--rdzv-id=" + run_id)  # the ssh clients and the remote agents
    check(len([p for p in agents if p in pids_with("--remote-agent")]) >= 2,
          "two remote agents run")
    return n, run_id, workers, agents


def _all_gone(run_id, workers, within):
    deadline = time.time() + within
    while time.time() < deadline:
        left = [p for p in workers if pid_alive(p)] + pids_with("--rdzv-id=" + run_id)
        if not left:
            return []
        time.sleep(0.05)
    return left


@with_hosts
def kill9(t, hosts):
    """kill -9 of the local ddprun: within 2 s no worker, remote agent or ssh client is left
    on either host."""
    n, run_id, workers, agents = _started_job(t, hosts, "kill9")
    n.signal(signal.SIGKILL)
    n.wait(10)
    killed = time.time()
    left = _all_gone(run_id, workers, 2.0)
    check(not left, "processes left 2 s after kill -9: %s" % left)
    print("%d workers and %d agent/ssh processes gone %.2f s after kill -9" %
          (len(workers), len(agents), time.time() - killed))


@with_hosts
def sigint(t, hosts):
    """Ctrl-C (SIGINT) of the local ddprun reaches every host: workers stop, ddprun exits 130,
    nothing is left."""
    n, run_id, workers, _ = _started_job(t, hosts, "sigint")
    n.signal(signal.SIGINT)
    rc = n.wait(30)
    check(rc == 130, "exit code %s (128 + SIGINT)" % rc)
    left = _all_gone(run_id, workers, 2.0)
    check(not left, "processes left after SIGINT: %s" % left)


@with_hosts
def unreachable(t, hosts):
    """A host nobody answers on fails the job at once with one line: the host and ssh's
    message."""
    e = dict(hosts.env, DDPRUN_LOG_LEVEL="warn")
    start = time.time()
    run_id = "ssh-unreachable-%d" % os.getpid()
    n = Node(t, "unreachable", ["--hosts=127.0.0.2:1,127.0.0.9:1", "--rdzv-id=" + run_id,
                                "--rdzv-endpoint=127.0.0.2:%d" % free_port("127.0.0.2"),
                                "--", WORKER, "--out",
                                os.path.join(t.out, "u"), "--finish-at-world", "99"], env=e)
    rc = n.wait(30)
    took = time.time() - start
    check(rc == 1, "exit code %s" % rc)
    lines = n.stderr().splitlines()
    print("\n".join(lines))
    check(len(lines) == 1, "one line of error (got %d)" % len(lines))
    check(lines[0].startswith("ddprun: host 127.0.0.9: cannot connect over ssh: ssh: connect to "
                              "host 127.0.0.9 port %d: Connection refused" % hosts.port),
          "the line names the host and has ssh's message")
    check(took < 15, "failed at once (%.1f s)" % took)
    gone = lambda: not pids_with("--rdzv-id=" + run_id)
    t.wait_for("the reachable host's agent to stop", gone, 5)


@with_hosts
def environment(t, hosts):
    """What travels: the default set and --export, through stdin; no value on any command
    line; a --hostfile with comments and slots; --ssh-option reaches ssh."""
    hostfile = os.path.join(t.dir, "hosts")
    with open(hostfile, "w") as f:
        f.write("# two hosts\n127.0.0.2 slots=1\n\n127.0.0.3 slots=1   # the second\n")
    secret = "s3cret-%d" % os.getpid()
    env = dict(hosts.env, NCCL_DEBUG_FILE="/tmp/nccl-%d" % os.getpid(), DDPRUN_TEST_SECRET=secret,
               MY_VAR="mine", NOT_EXPORTED="local-only")
    script = ('echo "env: $NCCL_DEBUG_FILE $DDPRUN_TEST_SECRET $MY_VAR $OTHER '
              '${NOT_EXPORTED:-unset} $RANK/$WORLD_SIZE"; sleep 1')
    run_id = "ssh-env-%d" % os.getpid()
    n = Node(t, "env", ["--hostfile=%s" % hostfile, "--rdzv-id=" + run_id,
                        "--ssh-option=ConnectTimeout=15", "--ssh-option=ServerAliveInterval=5",
                        "--export=MY_VAR", "--export=OTHER=given",
                        "--no-python", "sh", "-c", script], env=env)
    seen = []
    deadline = time.time() + 30
    while n.proc.poll() is None and time.time() < deadline:
        for p in pids_with("--rdzv-id=" + run_id):
            try:  # it may have exited since pids_with() saw it
                with open("/proc/%d/cmdline" % p, "rb") as f:
                    seen.append(f.read().decode(errors="replace"))
            except OSError:
                continue
        time.sleep(0.05)
    rc = n.wait(30)
    check(rc == 0, "exit code %s" % rc)
    check(seen, "the remote agents were seen running")
    check(not any(secret in c for c in seen), "no exported value on a remote command line")
    check(any("ServerAliveInterval=5" in c for c in seen),
          "--ssh-option reaches ssh's command line")
    lines = sorted(l for l in n.stdout().splitlines() if "env: " in l)
    want = ["[node %d rank %d]: env: /tmp/nccl-%d %s mine given unset %d/2" %
            (r, r, os.getpid(), secret, r) for r in (0, 1)]
    check(lines == want, "workers' environment: %s (want %s)" % (lines, want))


if __name__ == "__main__":
    raise SystemExit(run({"train": train, "worker_failure": worker_failure, "kill9": kill9,
                          "sigint": sigint, "unreachable": unreachable,
                          "environment": environment}))
