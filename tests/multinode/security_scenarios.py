"""Attacks on the store's authentication and on the rendezvous state, against the real binaries
(ddprun-store, ddprun agents). Usage: security_scenarios.py NAME (exit 0 / 1 / 77).

Each scenario says what it attacks, and checks that the keys stored before are intact and that
other clients are still served. The attacker is this script: a client of the store protocol
written here from docs/protocol.md (it authenticates with the HMAC proofs of rendezvous/auth.h
when it holds the token), a byte relay, or a fake store.
"""
import hashlib
import hmac
import os
import socket
import struct
import subprocess
import sys
import threading
import time

from harness import BIN, FAST_CONF, check, foreign_listener, free_port, run

STORE = os.path.join(BIN, "ddprun-store")
MAGIC = 0x3C85F7CE
SET, COMPARE_SET, GET, CHECK_, DELETE_KEY = 1, 2, 3, 5, 8
VALIDATE, PING, HELLO, AUTH, INFO = 0, 13, 0x60, 0x61, 0x63


def s_(b):
    return struct.pack("<Q", len(b)) + b


def proof(token, direction, ns, nc, channel):
    msg = b"".join(struct.pack("<I", len(p)) + p for p in (
        b"ddprun-store-auth-v2", direction, ns, nc, channel.encode()))
    return hmac.new(token, msg, hashlib.sha256).digest()


class Client:
    """A store client (current dialect + ddprun's extensions) that stops at nothing."""

    def __init__(self, port, token=None, host="127.0.0.1"):
        self.sock = socket.create_connection((host, port), timeout=10)
        self.buf = b""
        self.sock.sendall(bytes([VALIDATE]) + struct.pack("<I", MAGIC) + bytes([PING]) +
                          struct.pack("<I", 7) + bytes([HELLO]))
        check(self.u32() == 7, "PING echoed")
        check(self.str_() == b"ddprun-store/2", "a ddprun store")
        required, ns = self.u8(), self.str_()
        if token is not None:
            check(required == 1, "the store asks for authentication")
            nc = os.urandom(32)
            ip, p = self.sock.getpeername()[:2]
            channel = "%s:%d" % (ip, p)
            self.sock.sendall(bytes([AUTH]) + s_(nc) +
                              s_(proof(token, b"client->server", ns, nc, channel)))
            check(self.u8() == 0, "AUTH_OK")
            check(self.str_() == proof(token, b"server->client", ns, nc, channel),
                  "the store proves the token")

    def read(self, n):
        while len(self.buf) < n:
            got = self.sock.recv(65536)
            if not got:
                raise ConnectionError("closed by the store")
            self.buf += got
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def u8(self):
        return self.read(1)[0]

    def u32(self):
        return struct.unpack("<I", self.read(4))[0]

    def i64(self):
        return struct.unpack("<q", self.read(8))[0]

    def str_(self):
        return self.read(struct.unpack("<Q", self.read(8))[0])

    def set(self, k, v):
        self.sock.sendall(bytes([SET]) + s_(k.encode()) + s_(v.encode()))

    def get(self, k):
        self.sock.sendall(bytes([GET]) + s_(k.encode()))
        return self.str_().decode()

    def compare_set(self, k, expected, desired):
        self.sock.sendall(bytes([COMPARE_SET]) + s_(k.encode()) + s_(expected.encode()) +
                          s_(desired.encode()))
        return self.str_().decode()

    def exists(self, k):
        self.sock.sendall(bytes([CHECK_]) + struct.pack("<Q", 1) + s_(k.encode()))
        return self.u8() == 0

    def delete(self, k):
        self.sock.sendall(bytes([DELETE_KEY]) + s_(k.encode()))
        return self.i64()

    def info(self):
        self.sock.sendall(bytes([INFO]))
        return self.str_().decode(), self.str_().decode()

    def closed_by_store(self):
        """True when the store has closed this connection."""
        try:
            self.sock.sendall(bytes([PING]) + struct.pack("<I", 9))
            return self.u32() != 9
        except (ConnectionError, OSError):
            return True


def write_token(t, name, text, mode=0o600):
    path = os.path.join(t.dir, name)
    with open(path, "w") as f:
        f.write(text + "\n")
    os.chmod(path, mode)
    return path


class Store:
    """A real ddprun-store on 127.0.0.1, its log in a file."""

    def __init__(self, t, token_file=None):
        self.port = free_port("127.0.0.1")
        self.log = os.path.join(t.dir, "store-%d.log" % self.port)
        cmd = [STORE, "--host", "127.0.0.1", "--port", str(self.port)]
        if token_file:
            cmd += ["--auth-token-file", token_file]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(self.log, "w"),
                                     env=dict(os.environ, DDPRUN_LOG_LEVEL="info"))
        line = self.proc.stdout.readline()
        check(line, "ddprun-store started (%s)" % self.text())
        t.cleanups.append(self.stop)

    def text(self):
        with open(self.log) as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()


def relay(listen_port, target_port, stop):
    """A byte relay on 127.0.0.1:listen_port to 127.0.0.1:target_port (both directions)."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", listen_port))
    srv.listen(16)
    srv.settimeout(0.2)

    def pump(a, b):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                b.sendall(d)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def serve():
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except socket.timeout:
                continue
            u = socket.create_connection(("127.0.0.1", target_port))
            threading.Thread(target=pump, args=(c, u), daemon=True).start()
            threading.Thread(target=pump, args=(u, c), daemon=True).start()
        srv.close()
    threading.Thread(target=serve, daemon=True).start()


def agent_args(endpoint, rdzv_id, conf):
    return ["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=" + endpoint,
            "--rdzv-id=" + rdzv_id, "--rdzv-conf=" + conf]


def relayed_proof(t):
    """A relay between an agent and the real store: the agent's proof is made for the relay's
    address, so the store refuses it (and the relay gains no session); the store's keys are
    intact and a direct client is still served."""
    token = b"relay-attack-token-0f1e2d3c4b5a"
    tf = write_token(t, "job.token", token.decode())
    store = Store(t, tf)
    direct = Client(store.port, token)
    direct.set("before", "intact")
    stop = threading.Event()
    rport = free_port("127.0.0.1")
    relay(rport, store.port, stop)
    try:
        n = t.agent("relayed", "127.0.0.3", "2", "relayjob", [], endpoint="127.0.0.1:%d" % rport,
                    conf=FAST_CONF + ",is_host=false,token_file=" + tf)
        check(n.wait(60) != 0, "the relayed agent fails")
        check("refused our authentication token" in n.stderr(),
              "it says the store refused it: %s" % n.stderr()[-400:])
        check("wrong authentication proof" in store.text() and "relay" in store.text(),
              "the store logs the refusal: %s" % store.text()[-400:])
    finally:
        stop.set()
    check(direct.get("before") == "intact", "the key stored before is intact")
    check(Client(store.port, token).get("before") == "intact", "a new direct client is served")
    check(not direct.exists("ddprun/rdzv/relayjob/settings"),
          "the relayed agent wrote nothing")


def fake_server(t):
    """A fake store that asks for the token and answers AUTH_OK without knowing it (once with a
    made-up proof, once with none): the agent refuses it."""
    for with_proof in (True, False):
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        port = srv.getsockname()[1]

        def serve(srv=srv, with_proof=with_proof):
            while True:
                try:
                    c, _ = srv.accept()
                except OSError:
                    return
                c.settimeout(5)
                try:
                    hello = c.recv(64)
                    ping = hello[6:10] if len(hello) >= 10 else b"\0\0\0\0"
                    c.sendall(ping + s_(b"ddprun-store/2") + b"\x01" + s_(os.urandom(32)))
                    c.recv(4096)  # AUTH
                    c.sendall(b"\x00" + (s_(os.urandom(32)) if with_proof else b""))
                except OSError:
                    pass
                c.close()
        threading.Thread(target=serve, daemon=True).start()
        tf = write_token(t, "fake.token", "the-jobs-real-token-5a6b7c8d")
        n = t.agent("fake%d" % with_proof, "127.0.0.3", "2", "fakejob", [],
                    endpoint="127.0.0.1:%d" % port,
                    conf=FAST_CONF + ",is_host=false,token_file=" + tf)
        check(n.wait(60) != 0, "the agent refuses the fake store")
        check("without proving it knows the token" in n.stderr(),
              "it says the store did not prove the token: %s" % n.stderr()[-400:])
        srv.close()


def bad_token_files(t):
    """Token files that group or others can read, and short tokens, are refused by the store
    and by agents (naming the file and the fix); an authenticated job with --rdzv-conf
    token_file runs, its workers get the token file, and a client without it is refused."""
    loose = write_token(t, "loose.token", "a-long-enough-token-but-loose", 0o644)
    short = write_token(t, "short.token", "short")
    r = subprocess.run([STORE, "--port", "0", "--auth-token-file", loose],
                       capture_output=True, text=True, timeout=30)
    check(r.returncode != 0 and "chmod 600" in r.stderr and loose in r.stderr,
          "ddprun-store refuses a loose token file: %s" % r.stderr)
    r = subprocess.run([STORE, "--port", "0", "--auth-token-file", short],
                       capture_output=True, text=True, timeout=30)
    check(r.returncode != 0 and "at least 16" in r.stderr,
          "ddprun-store refuses a short token: %s" % r.stderr)
    for name, tf, says in (("loose", loose, "chmod 600"), ("short", short, "at least 16")):
        n = t.agent(name, "127.0.0.2", "2", "badtok", [],
                    conf=FAST_CONF + ",token_file=" + tf)
        check(n.wait(30) != 0 and says in n.stderr(),
              "the agent refuses the %s token file: %s" % (name, n.stderr()[-300:]))
        n = t.agent(name + "-env", "127.0.0.2", "2", "badtok", [],
                    env={"DDPRUN_STORE_TOKEN_FILE": tf})
        check(n.wait(30) != 0 and says in n.stderr(),
              "DDPRUN_STORE_TOKEN_FILE: the %s file is refused: %s" % (name, n.stderr()[-300:]))

    # The good path: two agents, one token file, every connection authenticated.
    good = write_token(t, "good.token", "every-agent-and-worker-holds-this")
    conf = FAST_CONF + ",token_file=" + good
    a = t.agent("a", "127.0.0.2", "2", "authjob", ["--run", "1.5"], conf=conf)
    t.wait_for("the store with authentication", lambda: "with authentication" in a.stderr() or
               a.proc.poll() is not None, 30)
    # A client without the token gets nothing from it meanwhile.
    try:
        Client(t.port, None, host="127.0.0.2").get("ddprun/rdzv/authjob/settings")
        raise AssertionError("unauthenticated GET served")
    except (ConnectionError, OSError):
        pass
    b = t.agent("b", "127.0.0.3", "2", "authjob", ["--run", "0.2"], conf=conf)
    check(a.wait(60) == 0 and b.wait(60) == 0, "the authenticated job succeeds")
    starts = t.starts()
    check(len(starts) == 2 and all(int(r["WORLD_SIZE"]) == 2 for r in starts),
          "one world of 2: %s" % starts)
    check(all(r["DDPRUN_STORE_TOKEN_FILE"] == good for r in starts),
          "the workers got the token file: %s" % [r["DDPRUN_STORE_TOKEN_FILE"] for r in starts])


def forged_state(t):
    """Without a token, anyone who reaches the store can write. A forged first state version (an
    nproc that overflows the world size, then garbage), and a `latest` hint naming a version
    nobody wrote: both agents report it in one line and fail within the join timeout instead of
    waiting; the store keeps serving and what it held is intact."""
    for forged, says in (
            ("ddprun-rendezvous-state 1\nround 1\nphase closed\nrestarts 0\nexit 0\nreason x\n"
             "member evil 10.6.6.6 2147483647 1 -1 -1\n", "corrupt or forged"),
            ("this is not a state", "corrupt or forged"),
            (None, "which was never written")):
        store = Store(t)
        attacker = Client(store.port)
        attacker.set("unrelated", "intact")
        job = "forged%d" % len(t.nodes)
        if forged is None:
            attacker.set("ddprun/rdzv/%s/latest" % job, "41")
        else:
            check(attacker.compare_set("ddprun/rdzv/%s/state/1" % job, "", forged) == forged,
                  "the forged version is written first")
            attacker.set("ddprun/rdzv/%s/latest" % job, "1")
        attacker.get("unrelated")  # a round trip: the forgery is in place before any agent
        ep = "127.0.0.1:%d" % store.port
        conf = FAST_CONF + ",is_host=false"
        a = t.agent("a%d" % len(t.nodes), "127.0.0.2", "2", job, [], endpoint=ep, conf=conf)
        b = t.agent("b%d" % len(t.nodes), "127.0.0.3", "2", job, [], endpoint=ep, conf=conf)
        for n in (a, b):
            check(n.wait(45) != 0, "%s fails" % n.name)
            lines = [ln for ln in n.stderr().splitlines() if says in ln]
            check(lines, "%s reports it in one line: %s" % (n.name, n.stderr()[-400:]))
            check(not t.starts(node=n.name), "%s started no worker" % n.name)
        check(attacker.get("unrelated") == "intact", "the store still serves, keys intact")
        store.stop()


def state_write_once(t):
    """During a real 2-agent job, an attacker without a token tries to delete and to overwrite
    the written state versions: the store refuses (closing the attacker's connection, one log
    line), every version keeps its value, and the job finishes normally."""
    store = Store(t)
    ep = "127.0.0.1:%d" % store.port
    conf = FAST_CONF + ",is_host=false"
    a = t.agent("a", "127.0.0.2", "2", "wo", ["--run", "3"], endpoint=ep, conf=conf)
    b = t.agent("b", "127.0.0.3", "2", "wo", ["--run", "3"], endpoint=ep, conf=conf)
    t.wait_for("both workers", lambda: len(t.starts()) == 2, 60)
    watcher = Client(store.port)
    latest = int(watcher.get("ddprun/rdzv/wo/latest"))
    check(latest >= 1, "versions written")
    before = {v: watcher.get("ddprun/rdzv/wo/state/%d" % v) for v in range(1, latest + 1)}
    for v in before:
        key = "ddprun/rdzv/wo/state/%d" % v
        for attack in ("delete", "set", "compare_set"):
            c = Client(store.port)
            if attack == "delete":
                try:
                    c.delete(key)
                except ConnectionError:
                    pass
                check(c.closed_by_store(), "DELETE of %s: connection closed" % key)
            elif attack == "set":
                c.set(key, "forged")
                check(c.closed_by_store(), "SET of %s: connection closed" % key)
            else:
                check(c.compare_set(key, before[v], "forged") == before[v],
                      "COMPARE_SET on %s keeps the version" % key)
    after = {v: watcher.get("ddprun/rdzv/wo/state/%d" % v) for v in before}
    check(after == before, "every version intact")
    check("refused: a written version is never changed or deleted" in store.text(),
          "the store logs the refusal: %s" % store.text()[-400:])
    check(a.wait(60) == 0 and b.wait(60) == 0, "the job finishes normally")


def forged_state_mid_job(t):
    """While a 2-agent job runs, an attacker without a token writes the next state version first
    (garbage) and sets the running round's `over` marker to it: both agents read it, report it
    in one line, stop their workers (which would run for 10 minutes) and fail instead of acting
    on it; the store keeps serving."""
    store = Store(t)
    ep = "127.0.0.1:%d" % store.port
    conf = FAST_CONF + ",is_host=false"
    a = t.agent("a", "127.0.0.2", "2", "mid", ["--run", "600"], endpoint=ep, conf=conf)
    b = t.agent("b", "127.0.0.3", "2", "mid", ["--run", "600"], endpoint=ep, conf=conf)
    t.wait_for("both workers", lambda: len(t.starts()) == 2, 60)
    attacker = Client(store.port)
    latest = int(attacker.get("ddprun/rdzv/mid/latest"))
    state = attacker.get("ddprun/rdzv/mid/state/%d" % latest)
    rnd = int([ln for ln in state.splitlines() if ln.startswith("round ")][0].split()[1])
    nxt = "ddprun/rdzv/mid/state/%d" % (latest + 1)
    check(attacker.compare_set(nxt, "", "garbage") == "garbage", "the forged version is first")
    attacker.set("ddprun/rdzv/mid/round/%d/over" % rnd, str(latest + 1))
    for n in (a, b):
        check(n.wait(120) != 0, "%s fails" % n.name)
        check([ln for ln in n.stderr().splitlines() if "'state/%d' is corrupt or forged"
               % (latest + 1) in ln], "%s reports it in one line: %s" % (n.name, n.stderr()[-400:]))
    check(attacker.get("ddprun/rdzv/mid/state/%d" % latest) == state, "the real versions intact")


def split_brain(t):
    """Two nodes both believe they host the endpoint, a shared virtual address: in two network
    namespaces joined by a veth pair, node a has the address 10.213.9.1; node b is told it is
    the host (is_host=true) and can bind that address without having it (ip_nonlocal_bind), so
    its store listens there while the endpoint routes to a's. b checks through the endpoint
    which store it reached, finds a's instance id, and refuses to go on; a's store is untouched
    and serves a third node, with which a's job finishes."""
    if os.geteuid() != 0:
        print("SKIP: needs root to create network namespaces (running as uid %d)" % os.geteuid())
        return 77
    tag = "%d" % (os.getpid() % 100000)
    ns = ["ddprun-sb-%s-a" % tag, "ddprun-sb-%s-b" % tag]
    vip, a_addr, b_addr = "10.213.9.1", "10.213.8.1", "10.213.8.2"
    setup = [["ip", "netns", "add", ns[0]], ["ip", "netns", "add", ns[1]],
             ["ip", "link", "add", "sba" + tag, "netns", ns[0], "type", "veth",
              "peer", "name", "sbb" + tag, "netns", ns[1]]]
    for i, (dev, addr) in enumerate((("sba" + tag, a_addr), ("sbb" + tag, b_addr))):
        setup += [["ip", "-n", ns[i], "addr", "add", addr + "/24", "dev", dev],
                  ["ip", "-n", ns[i], "link", "set", dev, "up"],
                  ["ip", "-n", ns[i], "link", "set", "lo", "up"]]
    setup += [["ip", "-n", ns[0], "addr", "add", vip + "/32", "dev", "lo"],
              ["ip", "-n", ns[1], "route", "add", vip + "/32", "via", a_addr],
              ["ip", "netns", "exec", ns[1], "sh", "-c",
               "echo 1 > /proc/sys/net/ipv4/ip_nonlocal_bind"]]
    try:
        for cmd in setup:
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                print("SKIP: `%s` failed: %s" % (" ".join(cmd), r.stderr.strip()))
                return 77
        in_a, in_b = ["ip", "netns", "exec", ns[0]], ["ip", "netns", "exec", ns[1]]
        # a: no --local-addr, so it hosts because the endpoint is one of its own addresses.
        a = t.agent("a", None, "2", "split", ["--run", "0.5"], endpoint=vip, prefix=in_a)
        t.wait_for("a hosts the store", lambda: "hosting the rendezvous store" in a.stderr()
                   or a.proc.poll() is not None, 30)
        b = t.agent("b", b_addr, "2", "split", [], endpoint=vip,
                    conf=FAST_CONF + ",is_host=true", prefix=in_b)
        check(b.wait(90) != 0, "b refuses to go on")
        check("hosting the rendezvous store" in b.stderr(), "b did host a store of its own")
        check("split brain" in b.stderr() and "reaches another store" in b.stderr(),
              "b says why: %s" % b.stderr()[-400:])
        check(not t.starts(node="b"), "b started no worker")
        c = t.agent("c", b_addr, "2", "split", ["--run", "0.5"], endpoint=vip, prefix=in_b)
        check(a.wait(90) == 0 and c.wait(90) == 0, "a's job finishes with c (a %s, c %s)"
              % (a.proc.returncode, c.proc.returncode))
        starts = t.starts()
        check(sorted(r["node"] for r in starts) == ["a", "c"] and
              {int(r["WORLD_SIZE"]) for r in starts} == {2}, "one world of a and c: %s" % starts)
    finally:
        t.cleanup()
        for n in ns:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


def two_agents_one_host(t):
    """torchrun's multi-agent setup (issue 15.2): two launchers with identical arguments on one
    machine. The first hosts the store at localhost:PORT; the second finds the port taken by a
    ddprun store answering for this job's id, and joins it as a client: one world of 4."""
    port = free_port("127.0.0.1")
    args = ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
            "--rdzv-endpoint=localhost:%d" % port, "--rdzv-id=multiagent",
            "--rdzv-conf=" + FAST_CONF]
    from harness import Node, WORKER
    a = Node(t, "a", args + [WORKER, "--out", os.path.join(t.out, "a"), "--run", "1"])
    t.wait_for("the first agent's store", lambda: "hosting the rendezvous store" in a.stderr()
               or a.proc.poll() is not None, 30)
    b = Node(t, "b", args + [WORKER, "--out", os.path.join(t.out, "b"), "--run", "1"])
    check(a.wait(60) == 0 and b.wait(60) == 0, "both agents exit 0 (a %s, b %s)"
          % (a.proc.returncode, b.proc.returncode))
    check("already hosted by another agent of job 'multiagent'" in b.stderr(),
          "the second says it joins as a client: %s" % b.stderr()[-400:])
    starts = t.starts()
    check(len(starts) == 4 and {int(r["WORLD_SIZE"]) for r in starts} == {4} and
          sorted(int(r["RANK"]) for r in starts) == [0, 1, 2, 3], "one world of 4: %s" % starts)

    # A port held by a foreign listener: today's clear error, nothing joined.
    srv = foreign_listener(b"SSH-2.0-OpenSSH_9.2\r\n", 4)
    foreign = srv.getsockname()[1]
    args[3] = "--rdzv-endpoint=localhost:%d" % foreign
    n = Node(t, "c", args + [WORKER, "--out", os.path.join(t.out, "c")])
    check(n.wait(60) != 0, "an agent facing a foreign listener fails")
    check("cannot host the rendezvous store at localhost:%d" % foreign in n.stderr() and
          "Address already in use" in n.stderr() and "not this job's store" in n.stderr(),
          "the clear error: %s" % n.stderr()[-400:])
    srv.close()


def two_jobs_one_endpoint(t):
    """Two agents of different jobs both claim the endpoint: the second finds a ddprun store of
    another job there and refuses (naming that job) instead of joining it; the first job runs."""
    a = t.agent("a", "127.0.0.2", "2", "first", ["--run", "2"])
    t.wait_for("the first job's store", lambda: "hosting the rendezvous store" in a.stderr()
               or a.proc.poll() is not None, 30)
    b = t.agent("b", "127.0.0.2", "2", "second", [])
    check(b.wait(60) == 1, "the second job's agent exits 1")
    check("the ddprun store of job 'first' holds it" in b.stderr(),
          "it names the job holding the port: %s" % b.stderr()[-400:])
    c = t.agent("c", "127.0.0.3", "2", "first", ["--run", "0.2"])
    check(a.wait(60) == 0 and c.wait(60) == 0, "the first job still runs and finishes")


def forged_timeline_bundles(t):
    """A static job of 6 nodes under --timeline: a (node rank 0, the trace's writer) and b ship
    their events, c..f run without --timeline, so their bundle keys are the attacker's. While the
    workers run, this script (a plain client of the rendezvous store a hosts) writes hostile bundles
    under ddprun/timeline/<run id>/<round>/node/K (docs/timeline.md), and (job 1) an early forgery
    for b's own key. Job 1 (exit 0): a 40 MiB value of 14 million empty events (parsed, ~1 GB), 5
    million open brackets, a bundle claiming a's agent and ranks 0, 1, 99 (and one event on its own
    rank 4), a bundle with an overflowing clock offset, negative and 2^64 counts, a 1e300 count and
    events with a string, float, 2^63-1 ts and a negative dur. Job 2 (b's worker exits 3, no
    restart): four bundles of the wrong shape. Node rank 0's ddprun must exit with the job's real
    code, write a valid trace that holds the real agents' events and none forged, name and count
    what it refused, and stay bounded in memory."""
    import json
    import resource
    runs = {}

    def job(tag, code, payloads, worker_b):
        trace = os.path.join(t.dir, tag + ".json")
        # Workers go on (finish, fail) only once the forgeries are stored: under load a worker
        # could otherwise end, and b ship its real bundle, before the attacker has written.
        gate = os.path.join(t.dir, tag + ".forged")
        port = free_port("127.0.0.2")
        nodes = []
        for rank, name in enumerate("abcdef"):
            rdzv = ["--rdzv-backend=static", "--node-rank=%d" % rank, "--master-addr=127.0.0.2",
                    "--master-port=%d" % port, "--rdzv-id=" + tag]
            extra = ["--max-restarts=0"] + (["--timeline=" + trace] if rank < 2 else [])
            args = ["--start-gate", gate] + (worker_b if rank == 1 else ["--run", "3"])
            nodes.append(t.agent(tag + name, "127.0.0.%d" % (rank + 2), "6", tag, args,
                                 conf=FAST_CONF, extra=extra, rdzv=rdzv))
        # The attacker: a client of the rendezvous store, as soon as a hosts it.
        client = None
        for _ in range(300):
            try:
                client = Client(port, host="127.0.0.2")
                break
            except (ConnectionError, OSError):
                time.sleep(0.05)
        check(client is not None, "the rendezvous store of %s is reachable" % tag)
        key = "ddprun/timeline/%s/0/node/%%d" % tag  # round 0: the only one
        if code == 0:
            # An early forgery of b's own bundle, which b's real one must replace: in a job that
            # succeeds b ships before the exit barrier the writer waits for. Not in the failed
            # job: there b ships while the writer collects, and a well-formed forgery under a
            # node's own key read first cannot be told from it (docs/security.md: the store's
            # token is the defence); asserting it there failed 2 runs of 13 in stop 31.
            client.set(key % 1, json.dumps({"node": "agent 127.0.0.3", "tracks": {
                "agent 127.0.0.3": [{"ph": "i", "ts": 1, "name": "forged early"}]}}))
        for k, value in payloads.items():
            client.set(key % k, value)
        check(all(client.exists(key % k) for k in payloads) and
              client.get(key % 5) == payloads[5], "the forgeries are stored")
        open(gate, "w").close()
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        got = nodes[0].wait(90)
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        for n in nodes[1:]:
            n.wait(90)
        check(got == code, "%s: node rank 0 exits %d, the job's code (got %s)" % (tag, code, got))
        # ru_maxrss of the biggest child so far: ddprun a (it hosts the store and merges).
        print("%s: exit %d, peak RSS of a child %.0f MiB (before %.0f MiB)" %
              (tag, got, peak / 1024, before / 1024))
        check(peak / 1024 < 400, "%s: ddprun's memory stays bounded (%.0f MiB < 400 MiB)" %
              (tag, peak / 1024))
        with open(trace) as f:
            data = json.load(f)  # valid JSON, or this raises
        names = {e["pid"]: e["args"]["name"] for e in data["traceEvents"]
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
        by = {}
        for e in data["traceEvents"]:
            if e.get("ph") in ("X", "i"):
                check(isinstance(e.get("ts"), int) and isinstance(e.get("tid", 0), int),
                      "integer ts and tid: %s" % e)
                check(e["ph"] != "X" or (isinstance(e.get("dur"), int) and e["dur"] >= 0),
                      "a span's dur is an integer >= 0: %s" % e)
                by.setdefault(names[e["pid"]], []).append(e)
        for real in ("agent 127.0.0.2", "agent 127.0.0.3"):
            evs = by.get(real, [])
            check(any(e["name"] == "worker start" for e in evs) and
                  any(e["name"] == "rendezvous" for e in evs),
                  "%s: the real %s's events are there: %s" % (tag, real, [e["name"] for e in evs]))
            check(not any("forged" in e["name"] for e in evs),
                  "%s: nothing forged on the real %s's track" % (tag, real))
        print("  tracks %s, refused: %s" % (sorted(names.values()),
                                            json.dumps(data["otherData"].get("refused"), indent=1)))
        for name in ("rank 0", "rank 1"):
            check(name not in names.values(), "%s: no forged %s track: %s" % (tag, name, names))
        check("refused" in nodes[0].stderr(), "%s: node rank 0's agent warns of the refusal" % tag)
        r = subprocess.run([os.path.join(BIN, "ddprun-trace"), trace], capture_output=True,
                           text=True, timeout=60)
        check(r.returncode == 0, "ddprun-trace reads the trace: %s" % r.stderr)
        runs[tag] = (data, by)
        return data, by

    now = int(time.time() * 1e6)
    empties = '{"node":"agent 127.0.0.4","tracks":{"rank 2":[' + \
        ",".join(["{}"] * 13_000_000) + "]}}"
    data, by = job("tlforge", 0, {
        2: empties,
        3: "[" * 5_000_000,
        4: json.dumps({"node": "agent 127.0.0.2", "tracks": {
            "agent 127.0.0.2": [{"ph": "i", "ts": now, "name": "forged agent event"}],
            "rank 0": [{"ph": "i", "ts": now, "name": "forged rank 0"}],
            "rank 1": [{"ph": "i", "ts": now, "name": "forged rank 1"}],
            "rank 99": [{"ph": "i", "ts": now, "name": "forged rank 99"}],
            "rank 4": [{"ph": "i", "ts": now, "name": "node 4's own rank"}]}}),
        5: '{"node":"agent 127.0.0.7","clock":{"offset_us":9223372036854775807,"bound_us":-1},'
           '"dropped_events":18446744073709551615,"skipped_lines":1e300,"parts_cut":-3,'
           '"tracks":{"rank 5":[{"ph":"i","ts":"soon","name":"string ts"},'
           '{"ph":"i","ts":9223372036854775807,"name":"huge ts"},{"ph":"i","ts":1.5,"name":"f"},'
           '{"ph":"X","ts":%d,"dur":-5,"name":"negative dur"},'
           '{"ph":"i","ts":%d,"tid":"x","name":"string tid"},'
           '{"ph":"i","ts":%d,"tid":5,"name":"node 5 survivor"}]}}' % (now, now, now),
    }, ["--run", "3"])
    other = data["otherData"]
    refused = "\n".join(other["refused"])
    check(other["bad_bundles"] == 2,
          "the oversize and the nested bundles refused whole: %s" % other)
    check("node rank 2: %d bytes, over the 16 MiB" % len(empties) in refused, "oversize named")
    check("node rank 3: nested deeper than 8 levels" in refused, "nesting named")
    check(other["refused_tracks"] == 3 and all(
        "node rank 4: track 'rank %d' is not" % r in refused for r in (0, 1, 99)),
        "ranks 0, 1, 99 claimed by node rank 4 refused and named: %s" % refused)
    check([e["name"] for e in by.get("rank 4", [])] == ["node 4's own rank"],
          "node rank 4's event on its own rank is kept")
    check(other["nodes_missing"] == [], "every node's key was written: %s" % other)
    check("node rank 5: its clock offset" in refused and "rank 5" in other["unaligned_tracks"],
          "the out-of-range clock refused: node 5 left unaligned")
    check([e["name"] for e in by.get("rank 5", [])] == ["node 5 survivor"] and
          by["rank 5"][0]["ts"] == now,
          "only node 5's valid event, unshifted: %s" % by.get("rank 5"))
    check(other["skipped_lines"] < 100 and other["parts_cut"] == 0 and
          all(n["dropped_events"] == 0 for n in other["other_nodes"]),
          "out-of-range counts read as 0: %s"
          % {k: other[k] for k in ("skipped_lines", "parts_cut")})
    forged_agents = [n for n in by if n.startswith("agent 127.0.0.2 (")]
    check(all(e["name"] == "forged agent event" for n in forged_agents for e in by[n]),
          "an agent name claimed twice stays apart from the real one: %s" % forged_agents)

    data, by = job("tlforge2", 3, {
        2: "not json {",
        3: "[1, 2, 3]",
        4: json.dumps({"node": "x" * 1000, "tracks": {}}),
        5: json.dumps({"node": "agent 127.0.0.7", "tracks": [1, 2]}),
    }, ["--always-fail", "1", "3", "--run", "30"])
    other = data["otherData"]
    check(other["bad_bundles"] == 4, "four bundles of the wrong shape refused: %s" % other)
    check(sum("not a bundle" in line for line in other["refused"]) == 4, "each named")
    failed = [e for e in by["agent 127.0.0.3"] if e["name"] == "worker exit"
              and e["args"]["failed"] == 1]
    check(len(failed) == 1 and failed[0]["args"]["result"] == "exit code 3",
          "b's real failed worker arrived: %s" % failed)


SCENARIOS = {f.__name__: f for f in (
    relayed_proof, fake_server, bad_token_files, forged_state, forged_state_mid_job,
    state_write_once, split_brain, two_agents_one_host, two_jobs_one_endpoint,
    forged_timeline_bundles)}

if __name__ == "__main__":
    sys.exit(run(SCENARIOS))
