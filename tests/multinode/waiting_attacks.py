"""Attacks on the waiting list's counters (issue 20's waiting list by counters,
docs/rendezvous.md "The waiting list by counters"), against the real binaries: a real
`ddprun-store`, real `ddprun` agents on 127.0.0.x, and this script as a hostile client of the
store's wire protocol (security_scenarios.Client). Usage: waiting_attacks.py NAME (exit 0/1/77).

The keys: r/<r>/waiting (an ADD gives an arrival at a full round its index), r/<r>/waiting.written
(each adds 1 once its entries are written) and the entries l/<2*10^9 + r>/<i-1>,
l/<2*10^9 + r>/id/<id> (write-once). Every scenario checks that the agents either refuse with a
line naming the key and its value or are not affected, that what the store held before is
intact, that another client is still served, and that every agent exits within a bound.
"""
import os
import struct
import sys
import time

from harness import FAST_CONF, check, run
from security_scenarios import Client, Store, write_token  # noqa: F401

ADD, MULTI_SET = 4, 11
WAITING_BASE = 2_000_000_000
# FAST_CONF with a keep-alive bound of 3 s instead of 0.9 s: under a loaded machine's scheduling
# the tighter bound made agents give up on a store that was merely slow to answer.
CONF = FAST_CONF.replace("heartbeat=0.3,missed_heartbeats=3", "heartbeat=0.5,missed_heartbeats=6")


class Attacker(Client):
    """The security scenarios' client, with the counters' ADD and MULTI_SET."""

    def add(self, k, delta):
        self.sock.sendall(bytes([ADD]) + struct.pack("<Q", len(k)) + k.encode() +
                          struct.pack("<q", delta))
        return self.i64()

    def multi_set(self, pairs):
        out = bytes([MULTI_SET]) + struct.pack("<Q", len(pairs))
        for k, v in pairs:
            out += struct.pack("<Q", len(k)) + k.encode() + struct.pack("<Q", len(v)) + v.encode()
        self.sock.sendall(out)


def closed_round(c, job):
    """The running round of `job` once it is closed: (round, every version so far by number)."""
    latest = int(c.get("ddprun/rdzv/%s/latest" % job))
    versions = {}
    v = 1
    while c.exists("ddprun/rdzv/%s/state/%d" % (job, v)):
        versions[v] = c.get("ddprun/rdzv/%s/state/%d" % (job, v))
        v += 1
    check(len(versions) >= latest, "versions 1..%d written" % latest)
    last = versions[max(versions)]
    fields = dict(ln.split(" ", 1) for ln in last.splitlines() if " " in ln)
    check(fields.get("phase") == "closed", "the round is closed: %s" % last)
    return int(fields["round"]), versions


def pair(t, store, job, worker_args, extra=()):
    """Agents a and b of `job` (--nnodes=1:2: the round is full with both) on `store`."""
    ep = "127.0.0.1:%d" % store.port
    conf = CONF + ",is_host=false"
    marker = os.path.join(t.out, "failed-once")  # worker.py --fail-once: once per job here
    if os.path.exists(marker):
        os.remove(marker)
    nodes = [t.agent(job + n, addr, "1:2", job, worker_args, endpoint=ep, conf=conf,
                     extra=list(extra)) for n, addr in (("a", "127.0.0.2"), ("b", "127.0.0.3"))]
    t.wait_for("%s: both workers" % job, lambda: len(t.starts(world=2)) >= 2 and
               all(t.starts(node=n.name) for n in nodes), 60)
    return nodes


def intact(store, before, job):
    """The keys stored before the attack keep their values; a new client is served."""
    fresh = Attacker(store.port)
    check(fresh.get("unrelated") == "intact", "a new client is served, the unrelated key intact")
    for v, text in before.items():
        check(fresh.get("ddprun/rdzv/%s/state/%d" % (job, v)) == text,
              "%s: version %d intact" % (job, v))


def refused(n, key, value, why):
    line = "rendezvous key '%s' counts %s, which is corrupt or forged (%s)" % (key, value, why)
    check([ln for ln in n.stderr().splitlines() if line in ln],
          "%s refuses in a line naming the key and the value (%s): %s"
          % (n.name, line, n.stderr()[-600:]))


def forged_waiting_counters(t):
    """Without a token, during real 2-node jobs at MAX (--nnodes=1:2): (1) the count driven below
    zero, so that an arrival's ADD hands it an index below 1: the arrival refuses naming the key
    and the index, counts itself nowhere and starts nothing, the job runs on and finishes;
    (2) a written count above the count, then a worker failure (a re-form reads both): the agents
    refuse naming the key and the count, within a bound, and start no worker of another round;
    (3) a flood: 300 well-formed waiting entries of nodes that do not exist with both counters in
    step, then a worker failure: round 2 expects them but closes with the two real nodes
    (MAX), the job restarts and finishes in time; (4) both counters in step at 2^40, and (5) at
    3, with no entry behind them, then a worker failure: the re-form ignores them with a warning
    naming the key and the count (never expecting, allocating or waiting for entries nobody
    wrote), and the job restarts with its two nodes and finishes."""
    store = Store(t)
    attacker = Attacker(store.port)
    attacker.set("unrelated", "intact")

    # (1) An index below 1.
    a, b = pair(t, store, "wlidx", ["--run", "6"])
    r, before = closed_round(attacker, "wlidx")
    count = "r/%d/waiting" % r
    check(attacker.add("ddprun/rdzv/wlidx/" + count, -100) == -100, "the count forged to -100")
    c = t.agent("wlidxc", "127.0.0.4", "1:2", "wlidx", [], endpoint="127.0.0.1:%d" % store.port,
                conf=CONF + ",is_host=false")
    t0 = time.time()
    check(c.wait(30) != 0, "the arrival fails")
    print("(1) the arrival refused in %.1f s" % (time.time() - t0))
    refused(c, count, "-99", "an index below 1")
    check(not t.starts(node="wlidxc"), "the arrival started no worker")
    check(not attacker.exists("ddprun/rdzv/wlidx/r/%d/waiting.written" % r),
          "the arrival counted itself nowhere")
    check(a.wait(60) == 0 and b.wait(60) == 0, "the job runs on and finishes (a %s, b %s)"
          % (a.proc.returncode, b.proc.returncode))
    check(len(t.starts(node="wlidxa")) == 1 and len(t.starts(node="wlidxb")) == 1,
          "no restart: %s" % t.starts())
    intact(store, before, "wlidx")

    # (2) A written count above the count, found by the re-form of a worker failure.
    gate = os.path.join(t.dir, "wlw.forged")
    args = ["--start-gate", gate, "--fail-once", "1", "3", "--run", "2"]
    a, b = pair(t, store, "wlw", args, extra=["--max-restarts=1"])
    r, before = closed_round(attacker, "wlw")
    count = "r/%d/waiting" % r
    attacker.add("ddprun/rdzv/wlw/" + count, 1)
    attacker.add("ddprun/rdzv/wlw/r/%d/waiting.written" % r, 4)
    open(gate, "w").close()
    t0 = time.time()
    codes = [n.wait(60) for n in (a, b)]
    print("(2) exits %s within %.1f s" % (codes, time.time() - t0))
    # The node whose worker failed reads the counters to re-form (failNode) and refuses; the
    # other refuses too if it re-forms from them, or evicts it (lost in process) and goes on.
    check(1 in codes, "an agent refuses: %s" % codes)
    for n in (a, b):
        if n.proc.returncode != 0:
            refused(n, count, "1", "fewer than written")
    check(not [s for s in t.starts(world=2) if s["node"] in ("wlwa", "wlwb") and
               s["TORCHELASTIC_RESTART_COUNT"] != "0"],
          "no worker of a restarted round of 2 (nothing trusted the forged counts): %s"
          % t.starts())
    intact(store, before, "wlw")

    # (3) A flood of phantom waiting nodes, well-formed and counted in step.
    gate = os.path.join(t.dir, "wlf.forged")
    args = ["--start-gate", gate, "--fail-once", "1", "3", "--run", "1"]
    a, b = pair(t, store, "wlf", args, extra=["--max-restarts=1"])
    r, before = closed_round(attacker, "wlf")
    ref = WAITING_BASE + r
    flood = 300
    first = attacker.add("ddprun/rdzv/wlf/r/%d/waiting" % r, flood)
    check(first == flood, "the flood takes indices 1..%d" % flood)
    pairs = []
    for i in range(flood):
        node = "phantom-%d" % i
        pairs.append(("ddprun/rdzv/wlf/l/%d/%d" % (ref, i),
                      "waiting %s 10.66.%d.%d 1 29500 -1 -1" % (node, i // 250, i % 250 + 1)))
        pairs.append(("ddprun/rdzv/wlf/l/%d/id/%s" % (ref, node), "%d 0" % i))
    attacker.multi_set(pairs)
    check(attacker.add("ddprun/rdzv/wlf/r/%d/waiting.written" % r, flood) == flood,
          "written in step")
    open(gate, "w").close()
    t0 = time.time()
    for n in (a, b):
        check(n.wait(60) == 0, "%s: the job restarts without the phantoms and finishes (exit %s)"
              % (n.name, n.proc.returncode))
    print("(3) restarted and finished in %.1f s" % (time.time() - t0))
    worlds = [int(s["WORLD_SIZE"]) for s in t.starts() if s["node"] in ("wlfa", "wlfb")]
    check(sorted(worlds) == [2, 2, 2, 2], "two rounds of the two real nodes: %s" % worlds)
    intact(store, before, "wlf")
    for i in (0, flood - 1):  # the attacker's entries are list keys: still write-once
        k = "ddprun/rdzv/wlf/l/%d/%d" % (ref, i)
        check(attacker.get(k).startswith("waiting phantom-%d " % i), "%s kept" % k)

    # (4) Both counters in step at 2^40, and (5) at 3, with no entry behind them.
    for tag, n_fake, why in (
            ("wlh", 1 << 40, "more than 1048576 waiting nodes"),
            ("wlp", 3, "its entry 'l/%d/2' was never written")):
        gate = os.path.join(t.dir, tag + ".forged")
        args = ["--start-gate", gate, "--fail-once", "1", "3", "--run", "1"]
        a, b = pair(t, store, tag, args, extra=["--max-restarts=1"])
        r, before = closed_round(attacker, tag)
        attacker.add("ddprun/rdzv/%s/r/%d/waiting" % (tag, r), n_fake)
        attacker.add("ddprun/rdzv/%s/r/%d/waiting.written" % (tag, r), n_fake)
        open(gate, "w").close()
        t0 = time.time()
        codes = [n.wait(60) for n in (a, b)]
        print("(%s) counters at %d: exits %s in %.1f s" % (tag, n_fake, codes, time.time() - t0))
        check(codes == [0, 0], "the forged counts are ignored, the job restarts and finishes: %s"
              % codes)
        line = "rendezvous key 'r/%d/waiting' counts %d, which is corrupt or forged (%s): ignored" \
            % (r, n_fake, why % (WAITING_BASE + r) if "%" in why else why)
        check([n for n in (a, b) if line in n.stderr()],
              "the re-form warns, naming the key and the value (%s)" % line)
        worlds = sorted((s["TORCHELASTIC_RESTART_COUNT"], int(s["WORLD_SIZE"]))
                        for s in t.starts() if s["node"] in (tag + "a", tag + "b"))
        check(worlds == [("0", 2), ("0", 2), ("1", 2), ("1", 2)],
              "round 2 of the two real nodes, expecting no phantom: %s" % worlds)
        intact(store, before, tag)
    check(Attacker(store.port).get("unrelated") == "intact", "the store still serves")


def waiting_counters_with_token(t):
    """With a job token (ddprun-store --auth-token-file, every agent token_file=): a client
    without the token cannot touch the waiting counters at all -- its ADD closes the connection
    before the frame is read, and the counter does not exist afterwards -- while the
    authenticated 2-node job forms and finishes."""
    token = b"waiting-counters-token-7c6b5a49"
    tf = write_token(t, "job.token", token.decode())
    store = Store(t, tf)
    ep = "127.0.0.1:%d" % store.port
    conf = CONF + ",is_host=false,token_file=" + tf
    a, b = [t.agent("tok" + n, addr, "1:2", "wltok", ["--run", "3"], endpoint=ep, conf=conf)
            for n, addr in (("a", "127.0.0.2"), ("b", "127.0.0.3"))]
    t.wait_for("both workers", lambda: len(t.starts(world=2)) >= 2, 60)
    owner = Attacker(store.port, token)
    r, before = closed_round(owner, "wltok")
    for key in ("r/%d/waiting" % r, "r/%d/waiting.written" % r):
        stranger = Attacker(store.port)  # no token: the handshake only
        try:
            stranger.add("ddprun/rdzv/wltok/" + key, -100)
            raise AssertionError("an unauthenticated ADD of %s was answered" % key)
        except (ConnectionError, OSError):
            pass
        check(not owner.exists("ddprun/rdzv/wltok/" + key), "%s was not created" % key)
    check(a.wait(60) == 0 and b.wait(60) == 0, "the authenticated job finishes")
    for v, text in before.items():
        check(owner.get("ddprun/rdzv/wltok/state/%d" % v) == text, "version %d intact" % v)


SCENARIOS = {f.__name__: f for f in (forged_waiting_counters, waiting_counters_with_token)}

if __name__ == "__main__":
    sys.exit(run(SCENARIOS))
