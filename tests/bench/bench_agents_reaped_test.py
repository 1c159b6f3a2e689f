"""ddprun-bench rendezvous ended by a signal (SIGTERM, as `timeout` sends) kills the agents it
started before it goes: they lead process groups of their own, so no signal meant for the bench
reaches them, and orphaned they went on (issue 20: agents of a failed 256-agent run alive
minutes later). The bench is stopped while it starts 64 agents: those started wait for the rest
to join (join_timeout, 600 s) unless killed. Real processes; no torch needed (--no-torchrun).
Exit 0 pass, 1 fail."""
import os
import signal
import subprocess
import sys
import tempfile
import time

BIN = os.environ.get("DDPRUN_BIN", os.path.join(os.path.dirname(__file__), "../../build/bin"))


def children(pid):
    out = []
    try:
        for tid in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def identity(pid):
    """(state, start time) of a process, or None once it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], fields[19]
    except OSError:
        return None


def agents_of(bench_pid):
    """Every live process of this bench's run (its run id, form64-<bench pid>-0, is on each
    agent's command line), zombies left out."""
    tag = b"form64-%d-" % bench_pid
    out = []
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % e, "rb") as f:
                if tag not in f.read():
                    continue
        except OSError:
            continue
        ident = identity(int(e))
        if ident and ident[0] != "Z":
            out.append(int(e))
    return out


def main():
    d = tempfile.mkdtemp(prefix="ddprun-bench-reaped-")
    bench = subprocess.Popen([os.path.join(BIN, "ddprun-bench"), "rendezvous", "--only", "form",
                              "--no-torchrun", "--sizes", "64", "--repeat", "1", "--csv",
                              os.path.join(d, "r.csv")], stdout=subprocess.DEVNULL,
                             stderr=open(os.path.join(d, "bench.err"), "w"),
                             start_new_session=True)
    agents = {}
    try:
        deadline = time.time() + 60
        while len(agents) < 4 and time.time() < deadline and bench.poll() is None:
            for c in children(bench.pid):
                if c not in agents and identity(c):
                    agents[c] = identity(c)[1]
            time.sleep(0.005)
        if len(agents) < 4:
            print("FAIL: the bench started %d agents within 60 s (exit %s)" %
                  (len(agents), bench.poll()))
            return 1
        bench.send_signal(signal.SIGTERM)
        code = bench.wait(30)
        ended = time.time()
        # Gone (or zombies) within a moment: SIGKILL takes effect at once. Those started after
        # the ones seen above too: every process naming this run.
        alive = agents_of(bench.pid)
        while alive and time.time() < ended + 3:
            time.sleep(0.05)
            alive = agents_of(bench.pid)
        print("bench exit %s after SIGTERM; %d agents started then, %d alive 3 s later (load %.2f)"
              % (code, len(agents), len(alive), os.getloadavg()[0]))
        if code != -signal.SIGTERM:
            print("FAIL: the bench ends by SIGTERM, as it was sent (exit %s)" % code)
            return 1
        if alive:
            print("FAIL: agents outlived the bench: %s" % alive)
            return 1
        print("PASS")
        return 0
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.wait()
        for p in agents_of(bench.pid):  # what a failed check left: this test's own agents
            try:
                os.killpg(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


if __name__ == "__main__":
    sys.exit(main())
