"""Attacks on the beat counters hb/<id> during a real job's exit barrier (issue 20;
docs/security.md, docs/rendezvous.md "The exit barrier"), against the real binaries: real `ddprun`
agents on 127.0.0.2-4, node a hosting the rendezvous store (so it is the barrier's judge: the
store's host and node rank 0 read every running member's counter each step and record those silent
for the keep-alive bound lost), and this script as a hostile client of that store's wire protocol
(waiting_attacks.Attacker). Usage: beat_counter_attacks.py NAME (exit 0/1/77).

a's worker succeeds at once, so a waits in the exit barrier while b's and c's workers run until
the test opens their gate. Every scenario checks what the agents say (a line naming the key and
the value), how the job ends, that the state versions and a key stored before the attack are
intact, that another client is still served, and that every agent exits within a stated bound.
"""
import os
import re
import signal
import sys
import threading
import time

from harness import FAST_CONF, check, run
from security_scenarios import write_token
from waiting_attacks import Attacker, closed_round

# A keep-alive bound of 2 s (0.4 s x 5), as exit_barrier_scenarios.py: the judge sweeps every 1 s.
BOUND = 2.0
CONF = FAST_CONF.replace("heartbeat=0.3,missed_heartbeats=3", "heartbeat=0.4,missed_heartbeats=5")
INT64_MAX = str(2 ** 63 - 1)


def job(t, name, conf, port=None, nodes="abc"):
    """Agents a (hosting the store at 127.0.0.2:port; its worker exits 0 at once), b, c, ...
    (workers that run until <dir>/<name>.gate exists) of job `name`; returns them, a client of
    the store, and each node's id once the round of all of them runs and a is in the barrier."""
    ep = "127.0.0.2:%d" % (port or t.port)
    gate = os.path.join(t.dir, name + ".gate")
    size = str(len(nodes))
    agents = [t.agent(name + n, "127.0.0.%d" % (2 + i), size, name,
                      ["--run", "0"] if i == 0 else ["--exit-when", gate], conf=conf, endpoint=ep)
              for i, n in enumerate(nodes)]
    t.wait_for("%s: a round of %s" % (name, size),
               lambda: len([s for s in t.starts(world=len(nodes)) if s["node"].startswith(name)])
               == len(nodes), 60)
    ids = {}
    for n in agents:
        m = t.wait_for("%s's node id" % n.name, lambda: re.search(
            r"node (\S+) connected to rendezvous", n.stderr()), 30)
        ids[n.name] = m.group(1)
    # a's worker exits 0 right after its record: a is in the exit barrier a moment later.
    time.sleep(1.5)
    check(agents[0].proc.poll() is None, "%s waits in the exit barrier (exit %s): %s"
          % (agents[0].name, agents[0].proc.returncode, agents[0].stderr()[-800:]))
    return agents, gate, ids


def hb(name, node_id):
    return "ddprun/rdzv/%s/hb/%s" % (name, node_id)


def intact(port, before, name, token=None):
    """What the store held before the attack is unchanged, and a new client is served."""
    fresh = Attacker(port, token, host="127.0.0.2")
    check(fresh.get("unrelated") == "intact", "a new client is served, the unrelated key intact")
    for v, text in before.items():
        check(fresh.get("ddprun/rdzv/%s/state/%d" % (name, v)) == text,
              "%s: version %d intact" % (name, v))


def finished(n, name, lost=0):
    """n's summary line says the job finished, with `lost` nodes lost in the exit barrier."""
    summary = [ln for ln in n.stderr().splitlines() if ln.startswith("ddprun: job '%s'" % name)]
    check(len(summary) == 1 and " finished" in summary[0], "%s: the job finished: %s"
          % (n.name, n.stderr()[-1500:]))
    says = "%d node(s) were lost in the exit barrier" % lost
    check((says in summary[0]) if lost else ("lost" not in summary[0]),
          "%s: %s: %s" % (n.name, says if lost else "nobody lost", summary[0]))


def no_store_lost(nodes):
    for n in nodes:
        check("lost the rendezvous store" not in n.stderr(),
              "%s did not declare the store lost: %s" % (n.name, n.stderr()[-1500:]))


def keep_adding(port, key, stop, token=None, every=0.2):
    """A thread that ADDs 1 to `key` every `every` s until `stop` is set (a dead node "beating")."""
    def loop():
        try:
            c = Attacker(port, token, host="127.0.0.2")
            while not stop.is_set():
                c.add(key, 1)
                stop.wait(every)
        except (ConnectionError, OSError):
            pass  # the store's host has exited
    th = threading.Thread(target=loop, daemon=True)
    th.start()
    return th


def forged_beat_counters(t):
    """Without a token, while a (the store's host, the judge) waits in the exit barrier and b's
    and c's workers run: b's counter, then a's own, is SET again and again (every 0.1 s for 0.6 s,
    then left alone for 0.8 s) to bytes that are no number, to a number beyond int64, to INT64_MAX
    (an ADD would overflow), to a negative number and to the empty value. The store refuses an
    ADD on the first three and the empty one by closing the ADDer's connection: the owner's
    writer finds its counter forged at its retry and restores it with one line naming the key and
    the value (before: two closed ADDs and the owner declared the store lost); a counter sent
    below the owner's last beat is set back above it (before: its beat keys went negative and the
    ring evicted a live node). No counter stands still for the keep-alive bound, so nobody is
    judged silent: every agent exits 0, the job finishes with nobody lost."""
    agents, gate, ids = job(t, "fbc", CONF)
    a, b, c = agents
    attacker = Attacker(t.port, host="127.0.0.2")
    attacker.set("unrelated", "intact")
    _, before = closed_round(attacker, "fbc")
    values = ["not a number \x07", "99999999999999999999999", INT64_MAX, "-5", ""]
    t0 = time.time()
    for target in (b, a):
        key = hb("fbc", ids[target.name])
        for value in values:
            until = time.time() + 0.6
            while time.time() < until:
                attacker.set(key, value)
                time.sleep(0.1)
            time.sleep(0.8)
            for n in agents:
                check(n.proc.poll() is None, "%s still runs after %s was forged to %r: %s"
                      % (n.name, key, value, n.stderr()[-1500:]))
        # Restored: a decimal count again, and moving.
        first = attacker.get(key)
        t.wait_for("%s moves again" % key, lambda: attacker.get(key) != first, 10)
        check(re.fullmatch(r"[1-9][0-9]*", attacker.get(key)), "%s restored: %r"
              % (key, attacker.get(key)))
    print("forged b's and a's counters for %.1f s" % (time.time() - t0))
    intact(t.port, before, "fbc")  # while a, hosting the store, still waits
    open(gate, "w").close()
    t0 = time.time()
    codes = [n.wait(60) for n in agents]
    print("exits %s within %.1f s (load %.2f)" % (codes, time.time() - t0, os.getloadavg()[0]))
    check(codes == [0, 0, 0], "every agent exits 0: %s" % codes)
    no_store_lost(agents)
    finished(a, "fbc")
    for n in agents:
        said = [ln for ln in n.stderr().splitlines() if " W " in ln and "store]" not in ln]
        print("%s's warnings (%d):\n  %s" % (n.name, len(said), "\n  ".join(said)))
    for n in (b, a):
        err, key = n.stderr(), "hb/" + ids[n.name]
        for shown, why in (("not a number \\x07", "not a beat count this node can add to"),
                           ("99999999999999999999999", "not a beat count this node can add to"),
                           (INT64_MAX, "not a beat count this node can add to"),
                           ("", "not a beat count this node can add to"),
                           ("-4", "below this node's last beat")):
            line = "rendezvous key '%s' holds '%s', which is corrupt or forged (%s" % (key, shown,
                                                                                      why)
            check(line in err, "%s names the key and the value (%s): %s"
                  % (n.name, line, err[-2500:]))


def kill_b_in_barrier(t, name, conf):
    """Starts job `name` (a hosting the store), writes a key the attacks must leave intact, reads
    the closed round, and SIGKILLs b while a waits in the exit barrier. Returns the agents, the
    gate that lets c's worker finish, the node ids, the attacker, the state read before and the
    time of the kill."""
    agents, gate, ids = job(t, name, conf)
    attacker = Attacker(t.port, host="127.0.0.2")
    attacker.set("unrelated", "intact")
    _, before = closed_round(attacker, name)
    b = agents[1]
    os.killpg(b.proc.pid, signal.SIGKILL)
    b.proc.wait()
    return agents, gate, ids, attacker, before, time.time()


def dead_member_kept_beating_in_barrier(t):
    """Without a token: b is SIGKILLed while a waits in the exit barrier, and the attacker ADDs 1
    to b's counter every 0.2 s from then on. Nobody can tell b from a live node whose worker
    runs: the judge sees its counter move, the ring its counter move past the beats it waited
    for. The bound is exit_barrier_timeout (15 s here, from a's arrival in the barrier): a, whose
    worker succeeded, waits that long and no longer, then exits 0 as torchrun's agent does, with
    a line naming b as the member that had not finished and whose heartbeat still counted; c
    (whose worker finishes 1 s after the kill) is done by then too, its store gone with a."""
    conf = CONF.replace("exit_barrier_timeout=30", "exit_barrier_timeout=15")
    (a, b, c), gate, ids, attacker, before, killed = kill_b_in_barrier(t, "dkb", conf)
    stop = threading.Event()
    th = keep_adding(t.port, hb("dkb", ids[b.name]), stop)
    try:
        time.sleep(1)
        open(gate, "w").close()
        time.sleep(2)
        intact(t.port, before, "dkb")  # while a, hosting the store, still waits
        codes = [n.wait(15 + 30) for n in (a, c)]
        took = time.time() - killed
    finally:
        stop.set()
        th.join()
    print("a and c exited %s, %.1f s after b was killed (exit_barrier_timeout 15 s, load %.2f)"
          % (codes, took, os.getloadavg()[0]))
    check(codes == [0, 0], "a and c exit 0, their workers succeeded (got %s)" % codes)
    # a entered the barrier ~1.5 s before the kill: well past one keep-alive bound and a sweep.
    check(took >= 15 - 5, "a waited for b as for a live node: %.1f s" % took)
    no_store_lost((a, c))
    line = [ln for ln in a.stderr().splitlines() if "exit barrier of round 0: only 2 of 3 nodes "
            "had finished when exit_barrier_timeout=15 s ran out" in ln]
    check(line and line[0].endswith("; not finished, their heartbeats still counting: %s; "
                                    "exiting 0" % ids[b.name]),
          "the judge a names b in the barrier's timeout: %s" % a.stderr()[-1500:])


def dead_member_kept_beating_at_close(t):
    """Without a token: b is SIGKILLed while a waits in the exit barrier; the judge records it
    lost within about one keep-alive bound, and from then on the attacker ADDs 1 to b's counter
    every 0.2 s. c's worker then finishes and the job with it: a (the store's host) waits for the
    lost b to learn the end only while b's counter moves, which now is forever: close_timeout
    (10 s here) bounds it, and a exits 0 naming b as not heard from."""
    conf = CONF.replace("close_timeout=5", "close_timeout=10")
    (a, b, c), gate, ids, attacker, before, killed = kill_b_in_barrier(t, "dkc", conf)
    stop = threading.Event()
    lost = "lost %s" % ids[b.name]
    t.wait_for("b recorded lost", lambda: lost in attacker.get(
        "ddprun/rdzv/dkc/state/%s" % attacker.get("ddprun/rdzv/dkc/latest")), 30)
    print("b recorded lost %.1f s after the kill (keep-alive bound %.1f s)"
          % (time.time() - killed, BOUND))
    th = keep_adding(t.port, hb("dkc", ids[b.name]), stop)
    try:
        time.sleep(0.5)
        intact(t.port, before, "dkc")  # while a, hosting the store, still waits
        open(gate, "w").close()
        ended = time.time()
        codes = [n.wait(10 + 30) for n in (a, c)]
        took = time.time() - ended
    finally:
        stop.set()
        th.join()
    print("a and c exited %s, %.1f s after c's worker was let go (close_timeout 10 s, load %.2f)"
          % (codes, took, os.getloadavg()[0]))
    check(codes == [0, 0], "a and c exit 0, their workers succeeded: %s" % codes)
    check(took >= 10 - 2, "a waited for b while its counter moved: %.1f s" % took)
    finished(a, "dkc", lost=1)
    line = "close_timeout=10 s ran out before every node learned that the job ended; " \
           "not heard from: %s" % ids[b.name]
    check(line in a.stderr(), "a names b (%s): %s" % (line, a.stderr()[-1500:]))


def beat_counters_with_token(t):
    """With a job token (every agent's token_file=; a hosts the store, which then authenticates
    every connection): a client without the token cannot SET, ADD to or DELETE b's counter --
    each closes its connection before the frame is read, and the counter keeps counting b's
    beats. b is then SIGKILLed while a waits in the exit barrier, the stranger still ADDing to its
    counter: the judge finds b silent and records it lost within about one keep-alive bound, as
    host_waits_for_gone_members without attack, and the job finishes with c."""
    token = b"beat-counters-token-5e4d3c2b1a09"
    tf = write_token(t, "job.token", token.decode())
    agents, gate, ids = job(t, "tbc", CONF + ",token_file=" + tf)
    a, b, c = agents
    owner = Attacker(t.port, token, host="127.0.0.2")
    owner.set("unrelated", "intact")
    _, before = closed_round(owner, "tbc")
    key = hb("tbc", ids[b.name])
    for attack in ("set", "add", "delete"):
        stranger = Attacker(t.port, host="127.0.0.2")  # no token: the handshake only
        was = int(owner.get(key))
        try:
            getattr(stranger, attack)(*{"set": (key, "forged"), "add": (key, 1 << 40),
                                        "delete": (key,)}[attack])
        except (ConnectionError, OSError):
            pass
        check(stranger.closed_by_store(), "an unauthenticated %s of %s: connection closed"
              % (attack.upper(), key))
        now = owner.get(key)
        check(re.fullmatch(r"[0-9]+", now) and was <= int(now) < was + 20,
              "%s still counts b's beats after the %s: %s then %s" % (key, attack, was, now))
    stop = threading.Event()

    def strangers():  # a new unauthenticated connection per ADD: each is closed
        while not stop.is_set():
            try:
                Attacker(t.port, host="127.0.0.2").add(key, 1)
            except (ConnectionError, OSError):
                pass
            stop.wait(0.2)
    th = threading.Thread(target=strangers, daemon=True)
    th.start()
    try:
        os.killpg(b.proc.pid, signal.SIGKILL)
        b.proc.wait()
        killed = time.time()
        t.wait_for("b recorded lost", lambda: "lost %s" % ids[b.name] in owner.get(
            "ddprun/rdzv/tbc/state/%s" % owner.get("ddprun/rdzv/tbc/latest")), 30)
        took = time.time() - killed
    finally:
        stop.set()
        th.join()
    print("b recorded lost %.1f s after the kill (keep-alive bound %.1f s, load %.2f)"
          % (took, BOUND, os.getloadavg()[0]))
    # One bound of silence, the sweep's step (half a bound), and a margin for a loaded machine.
    check(took < 3 * BOUND + 3, "within about one bound: %.1f s" % took)
    # The judge's sweep (one line naming every node it records) or the ring's watcher of b.
    check([n for n in (a, c) if re.search(r"(recorded lost at once:.* |node )%s( |$)" %
                                          re.escape(ids[b.name]), n.stderr(), re.M)],
          "a judge or b's watcher names b lost: %s" % a.stderr()[-1500:])
    intact(t.port, before, "tbc", token)
    open(gate, "w").close()
    codes = [n.wait(60) for n in (a, c)]
    check(codes == [0, 0], "a and c exit 0: %s" % codes)
    finished(a, "tbc", lost=1)
    no_store_lost((a, c))


SCENARIOS = {f.__name__: f for f in (forged_beat_counters, dead_member_kept_beating_in_barrier,
                                     dead_member_kept_beating_at_close, beat_counters_with_token)}

if __name__ == "__main__":
    sys.exit(run(SCENARIOS))
