"""The exit barrier when many members are gone at once (issue 20; docs/rendezvous.md, "The exit
barrier"). The store host's workers have succeeded and it waits in the exit barrier; the other
agents are then killed (SIGKILL, as agents that declared the store lost and exited: they tell
nobody) or stopped (SIGSTOP, hung). The contract: the host finds every silent member within
about one keep-alive bound of the last one going -- all of them in one pass, not one per bound
around the heartbeat ring -- records them lost, and exits 0 (its workers succeeded) without
waiting for exit_barrier_timeout nor for close_timeout on nodes that will never read the end.
Real agents on loopback addresses (harness.py). Usage: exit_barrier_scenarios.py NAME.
"""
import os
import signal
import sys
import time

from harness import FAST_CONF, check, run

# A keep-alive bound of 2 s (0.4 s x 5): the ring alone evicts one silent node per bound, so
# four gone at once cost it 8 s before the round is finished, and close_timeout (20 s) more
# waiting for them to read the job's end. exit_barrier_timeout is far beyond either.
CONF = FAST_CONF.replace("heartbeat=0.3,missed_heartbeats=3", "heartbeat=0.4,missed_heartbeats=5") \
    .replace("close_timeout=5", "close_timeout=20").replace("exit_barrier_timeout=30",
                                                            "exit_barrier_timeout=120")
BOUND = 2.0


def host_waits_for_gone_members(t):
    """Five nodes; a hosts the store. a's worker succeeds at once; b, c and d are then killed
    (SIGKILL) and e stopped (SIGSTOP) while their workers run. a exits 0 within one bound, a
    sweep and a margin after they went (before: one bound per node and close_timeout), naming
    the four lost in the exit barrier."""
    gate = os.path.join(t.dir, "gate")  # the others' workers run until it exists
    a = t.agent("a", "127.0.0.2", "5", "barrier", ["--run", "0"], conf=CONF)
    others = [t.agent(name, "127.0.0.%d" % (3 + i), "5", "barrier", ["--exit-when", gate],
                      conf=CONF) for i, name in enumerate("bcde")]
    try:
        t.wait_for("a round of 5", lambda: len(t.starts(world=5)) == 5, 60)
        # a's worker exits 0 right after its record: a is in the exit barrier a moment later
        # (the agent logs nothing there at level info).
        time.sleep(1.5)
        check(a.proc.poll() is None, "a waits in the exit barrier (exit %s): %s" %
              (a.proc.returncode, a.stderr()[-800:]))
        gone = time.time()
        for n in others[:3]:
            os.killpg(n.proc.pid, signal.SIGKILL)
        os.killpg(others[3].proc.pid, signal.SIGSTOP)
        code = a.wait(90)
        took = time.time() - gone
    finally:
        open(gate, "w").close()  # workers the killed agents left behind exit
    load = os.getloadavg()[0]
    print("node a exited %s, %.2f s after 4 of the 5 nodes went (keep-alive bound %.1f s, "
          "load %.2f)" % (code, took, BOUND, load))
    err = a.stderr()
    check(code == 0, "a exits 0, its workers succeeded (got %s): %s" % (code, err[-1500:]))
    # One bound of silence, the sweep's half-bound step, and a margin for a loaded machine.
    check(took < 3 * BOUND + 3, "a is done within about one bound of the others going, not one "
          "bound per node nor close_timeout: %.2f s: %s" % (took, err[-1500:]))
    check("recorded lost at once" in err, "a found the silent nodes in one pass: %s" %
          err[-1500:])
    summary = [line for line in err.splitlines() if line.startswith("ddprun: job '")]
    check(len(summary) == 1 and "4 node(s) were lost in the exit barrier" in summary[0],
          "a's summary names the four lost: %s" % summary)
    check("close_timeout" not in err, "a waited for no lost node to read the end: %s" %
          err[-1500:])


SCENARIOS = {f.__name__: f for f in (host_waits_for_gone_members,)}

if __name__ == "__main__":
    sys.exit(run(SCENARIOS))
