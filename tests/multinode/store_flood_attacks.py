"""A flood of the rendezvous store an agent hosts on its real-time thread (docs/security.md, the
"CPU:" row; docs/rendezvous.md "The store's malloc arena and real-time priority (stop 42)"),
against the real binaries: a real 2-node `ddprun` job on 127.0.0.2-3, node a hosting the store
on its thread named ddprun-store at SCHED_RR 1, and this script's processes as hostile clients of
that store's wire protocol (waiting_attacks.Attacker). Usage: store_flood_attacks.py NAME
(exit 0/1/77: skipped, saying why, where the thread does not get real-time priority).

The flood is what a hostile client can do without a token: many connections pipelining valid
requests (GET, ADD, CHECK) as fast as they are answered, and a stream of connections sending
garbage, oversized frames and unknown commands. A store thread at real-time priority serves
them ahead of every normal thread on its CPU; what bounds it is the kernel's real-time
throttling and that it is one thread. The contract checked: the store thread really is SCHED_RR
and uses at most one CPU, the agent's other threads keep running (both nodes' beat counters
move at least once per keep-alive bound, the host's exit barrier completes), another client is
served within a bound, the keys stored before are intact, and the job finishes with exit 0 on
both nodes, in bounded time, with nobody declaring the store lost.
"""
import multiprocessing
import os
import socket
import statistics
import struct
import sys
import time

from beat_counter_attacks import BOUND, CONF, finished, hb, intact, job, no_store_lost
from harness import check, run
from security_scenarios import CHECK_, GET, PING, s_
from store_lost_scenarios import store_thread
from waiting_attacks import ADD, Attacker, closed_round

TICK = os.sysconf("SC_CLK_TCK")
VALUE = "v" * 100  # what the flood GETs
FLOOD_S = 5.0  # the measured part of the flood, before the job is let finish under it
BATCH, ADDS = 1500, 500  # requests pipelined per batch (GET, ADD, CHECK in turn), its ADDs


def cpu_seconds(pid, tid):
    """CPU seconds (utime + stime) used so far by thread `tid` of process `pid`, and by the
    whole process (all its threads)."""
    def used(path):
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    return used("/proc/%d/task/%d/stat" % (pid, tid)), used("/proc/%d/stat" % pid)


def policy(tid):
    """The scheduling policy of thread `tid`, without the SCHED_RESET_ON_FORK flag."""
    return os.sched_getscheduler(tid) & ~os.SCHED_RESET_ON_FORK


def storm(port, conns, served, batch):
    """A flooding process: `conns` connections, each keeping two batches of `batch` pipelined
    GET/ADD/CHECK requests in flight, reading every reply; adds the requests answered to
    `served`. Ends when the store goes (its host exited)."""
    reqs, reply = b"", 0
    for i in range(batch):
        kind = i % 3
        if kind == 0:
            reqs += bytes([GET]) + s_(b"flood/v")
            reply += 8 + len(VALUE)
        elif kind == 1:
            reqs += bytes([ADD]) + s_(b"flood/n%d" % (i % 7)) + struct.pack("<q", 1)
            reply += 8
        else:
            reqs += bytes([CHECK_]) + struct.pack("<Q", 1) + s_(b"flood/v")
            reply += 1
    try:
        socks = [Attacker(port, host="127.0.0.2").sock for _ in range(conns)]
        for s in socks:
            s.sendall(reqs + reqs)
        while True:
            for s in socks:
                left = reply
                while left:
                    got = s.recv(min(left, 1 << 16))
                    if not got:
                        return
                    left -= len(got)
                s.sendall(reqs)
                served.value += batch
    except (ConnectionError, OSError):
        return


def garbage(port, closed, kept):
    """A flooding process: connection after connection sending bytes the store must refuse --
    noise before the handshake, a SET whose key length is 2^40, an unknown command -- each
    counted in `closed` when the store closes it within 5 s, else in `kept`."""
    n = 0
    while True:
        n += 1
        try:
            if n % 3 == 0:
                sock = socket.create_connection(("127.0.0.2", port), timeout=5)
                sock.sendall(b"\xff" + os.urandom(511))  # 0xff: no command at all
            else:
                sock = Attacker(port, host="127.0.0.2").sock
                sock.sendall(bytes([1]) + struct.pack("<Q", 1 << 40) if n % 3 == 1
                             else bytes([0xEE]) + os.urandom(64) + bytes([PING]))
        except (ConnectionError, OSError):
            if n > 1:
                return  # the store has gone
            continue
        try:
            while sock.recv(65536):
                pass
            closed.value += 1
        except socket.timeout:
            kept.value += 1
        except OSError:
            closed.value += 1
        sock.close()


def probe(port, seconds):
    """An honest client for `seconds`: every 0.1 s a new connection (handshake) and a GET of a
    key stored before; returns the latencies (s)."""
    took = []
    until = time.time() + seconds
    while time.time() < until:
        t0 = time.time()
        check(Attacker(port, host="127.0.0.2").get("unrelated") == "intact",
              "an honest client reads the key stored before")
        took.append(time.time() - t0)
        time.sleep(0.1)
    return took


def realtime_store_flood(t):
    """Node a hosts the store at real-time priority; its worker succeeds at once, so a waits in
    the exit barrier (its main thread sweeping the members' counters) while b's worker runs.
    Two processes of 8 connections each storm the store with pipelined GET/ADD/CHECK, a third
    opens connection after connection of garbage; the flood runs for FLOOD_S s while an honest
    client is probed, then b's worker is let finish under it: the job ends with exit 0 on both
    nodes within a bound."""
    agents, gate, ids = job(t, "rtf", CONF, nodes="ab")
    a, b = agents
    tid = store_thread(a.proc.pid)
    check(tid, "a has a thread named ddprun-store")
    if policy(tid) != os.SCHED_RR:
        line = [ln for ln in a.stderr().splitlines() if "hosting the rendezvous store" in ln]
        print("SKIP: the store's thread does not run at real-time priority here (policy %d; "
              "CAP_SYS_NICE or RLIMIT_RTPRIO needed, and an rt runtime for the cgroup): %s"
              % (policy(tid), line))
        return 77
    check(os.sched_getparam(tid).sched_priority == 1, "SCHED_RR 1")
    check(os.sched_getscheduler(tid) & os.SCHED_RESET_ON_FORK, "reset on fork")
    check(os.sched_getscheduler(a.proc.pid) == os.SCHED_OTHER, "a's main thread is not raised")
    check("of its own at real-time priority (SCHED_RR 1)" in a.stderr(), "a says so: %s"
          % a.stderr()[-800:])
    with open("/proc/sys/kernel/sched_rt_runtime_us") as f:
        rt_runtime = int(f.read())
    honest = Attacker(t.port, host="127.0.0.2")
    honest.set("unrelated", "intact")
    honest.set("flood/v", VALUE)
    _, before = closed_round(honest, "rtf")
    ctx = multiprocessing.get_context("fork")
    served = [ctx.Value("q", 0, lock=False) for _ in range(2)]
    closed, kept = ctx.Value("q", 0, lock=False), ctx.Value("q", 0, lock=False)
    flood = [ctx.Process(target=storm, args=(t.port, 8, v, BATCH), daemon=True)
             for v in served] + [ctx.Process(target=garbage, args=(t.port, closed, kept),
                                             daemon=True)]
    for p in flood:
        p.start()
    try:
        time.sleep(1.0)  # under way
        beats = {n: int(honest.get(hb("rtf", ids[n.name]))) for n in (a, b)}
        t0, (cpu_thread, cpu_agent) = time.time(), cpu_seconds(a.proc.pid, tid)
        served0, closed0 = sum(v.value for v in served), closed.value
        took = probe(t.port, FLOOD_S)
        intact(t.port, before, "rtf")
        wall = time.time() - t0
        now_thread, now_agent = cpu_seconds(a.proc.pid, tid)
        thread_share, agent_share = (now_thread - cpu_thread) / wall, (now_agent - cpu_agent) / wall
        moved = {n: int(honest.get(hb("rtf", ids[n.name]))) - beats[n] for n in (a, b)}
        total = sum(v.value for v in served)
        rate = (total - served0) / wall
        # The store counted the ADDs it answered: at least those of every batch counted here.
        adds = sum(int(honest.get("flood/n%d" % i)) for i in range(7))
        check(adds >= total // BATCH * ADDS, "the flood's ADDs were applied: %d, %d counted "
              "answered" % (adds, total // BATCH * ADDS))
        garbage_rate = (closed.value - closed0) / wall
        check(policy(tid) == os.SCHED_RR, "the store's thread is still SCHED_RR")
        print("flood for %.1f s (load %.2f, sched_rt_runtime_us %d): %.0f requests/s answered, "
              "%.0f garbage connections/s closed; the store's thread used %.2f CPU, agent a in all "
              "%.2f; an honest client's connect+GET: median %.1f ms, max %.1f ms over %d; beats "
              "during it: %s (one per %.1f s at least)"
              % (wall, os.getloadavg()[0], rt_runtime, rate, garbage_rate, thread_share,
                 agent_share, statistics.median(took) * 1e3, max(took) * 1e3, len(took),
                 {n.name: m for n, m in moved.items()}, BOUND))
        # One thread: at most one CPU (with a tick's slack); and it was really flooded.
        check(thread_share <= 1.02, "the store's thread used at most one CPU: %.2f" % thread_share)
        check(agent_share <= thread_share + 0.3,
              "the rest of agent a did not take the flood's CPU: %.2f in all, %.2f the store's "
              "thread" % (agent_share, thread_share))
        check(thread_share >= 0.2 and rate >= 5000,
              "the flood kept the store's thread busy: %.2f CPU, %.0f requests/s"
              % (thread_share, rate))
        check(max(took) < BOUND / 2, "the honest client was served within %.1f s each time: max "
              "%.2f s" % (BOUND / 2, max(took)))
        for n, m in moved.items():
            check(m >= wall / BOUND, "%s's heartbeat kept beating: %d beats in %.1f s"
                  % (n.name, m, wall))
        for n in (a, b):
            check(n.proc.poll() is None, "%s runs on under the flood: %s" % (n.name,
                                                                         n.stderr()[-1500:]))
        open(gate, "w").close()  # b's worker finishes, the job ends under the flood
        t0 = time.time()
        codes = [n.wait(60) for n in (a, b)]
        ended = time.time() - t0
    finally:
        for p in flood:
            if p.is_alive():
                os.kill(p.pid, 9)
            p.join()
    print("exits %s within %.1f s of the gate, under the flood (load %.2f); garbage connections: "
          "%d closed by the store, %d not within 5 s" % (codes, ended, os.getloadavg()[0],
                                                        closed.value, kept.value))
    check(codes == [0, 0], "both agents exit 0: %s" % codes)
    check(ended < 20, "the job finished in bounded time: %.1f s" % ended)
    no_store_lost((a, b))
    finished(a, "rtf")
    check(kept.value == 0 and closed.value > 0, "every garbage connection was closed")
    said = [ln for ln in a.stderr().splitlines() if "store]" in ln]
    print("a's store lines: %d, e.g.\n  %s" % (len(said), "\n  ".join(said[:3])))
    check(len(said) < 200, "the store's lines are rate-limited: %d" % len(said))


SCENARIOS = {f.__name__: f for f in (realtime_store_flood,)}

if __name__ == "__main__":
    sys.exit(run(SCENARIOS))
