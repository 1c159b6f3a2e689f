#!/usr/bin/env python3
"""Attacks on the real ddprun-store binary (issue 9; docs/security.md lists what each shows).

Each attack says what it attacks, and checks that the keys stored before are intact and that
another client is still served while (or after) it runs. Raw sockets in the torch 1.13 (legacy)
dialect, as torch's own client speaks it; any python3 will do.

  store_attacks.py [ATTACK...]     (default: all; DDPRUN_BIN names the directory of ddprun-store)
"""
import os
import re
import resource
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

BIN = os.environ.get("DDPRUN_BIN", os.path.join(os.path.dirname(__file__), "../../build/bin"))
LEG_SET, LEG_GET = 0, 2
HELLO = 0x60
MiB = 1 << 20


def s(b):
    b = b if isinstance(b, bytes) else b.encode()
    return struct.pack("<Q", len(b)) + b


class Store:
    """One ddprun-store process on a free port, its log in a file."""

    def __init__(self, *flags, limit_fds=None):
        self.dir = tempfile.mkdtemp(prefix="store-attack-")
        self.log_path = os.path.join(self.dir, "store.log")
        self.log = open(self.log_path, "wb")

        def preexec():
            if limit_fds:  # soft and hard: ddprun-store cannot raise it back
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit_fds, limit_fds))

        self.proc = subprocess.Popen([os.path.join(BIN, "ddprun-store"), "--port", "0",
                                      "--host", "127.0.0.1", *flags],
                                     stdout=subprocess.PIPE, stderr=self.log, preexec_fn=preexec)
        line = self.proc.stdout.readline().decode()
        m = re.search(r"listening on [^:]+:(\d+)", line)
        if not m:
            raise SystemExit("FAIL: ddprun-store did not start: %r" % line)
        self.port = int(m.group(1))

    def rss_mib(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return -1

    def log_text(self):
        self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.log.close()


class Client:
    """A legacy-dialect (torch 1.13) client."""

    def __init__(self, port, timeout=10):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def set(self, key, value):
        self.sock.sendall(bytes([LEG_SET]) + s(key) + s(value))

    def get(self, key):
        self.sock.sendall(bytes([LEG_GET]) + s(key))
        (n,) = struct.unpack("<Q", self.recv(8))
        return self.recv(n)

    def recv(self, n):
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(min(n - len(out), 1 << 20))
            if not chunk:
                raise ConnectionError("the store closed the connection")
            out += chunk
        return out

    def close(self):
        self.sock.close()


failures = []


def closed_by_peer(sock, timeout):
    """True when the store closes `sock` within `timeout` seconds (what it sent is skipped)."""
    sock.settimeout(timeout)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except socket.timeout:
        return False
    except OSError:
        return True


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        failures.append(what)


def store_before(port):
    c = Client(port)
    c.set("before", "intact")
    c.get("before")  # a round trip: stored before the attack starts
    c.close()


def stored_and_served(port, big=None):
    c = Client(port)
    check(c.get("before") == b"intact", "the key stored before the attack is intact")
    if big is not None:
        check(c.get("big") == big, "the 8 MiB key stored before the attack is intact")
    c.set("after", "served")
    check(c.get("after") == b"served", "another client is served")
    c.close()


def no_read_flood():
    """Attacks the store's memory: SET an 8 MiB key, then pipeline 200 GETs of it without
    reading a reply (before the fix RSS went from 5 to 533 MiB). RSS must stay bounded."""
    store = Store()
    try:
        big = os.urandom(8 * MiB)
        c = Client(store.port)
        c.set("before", "intact")
        c.set("big", big)
        check(c.get("big") == big, "the 8 MiB key is stored")  # a round trip: stored now
        stored_and_served(store.port, big)
        rss_before = store.rss_mib()
        flood = Client(store.port)
        frames = (bytes([LEG_GET]) + s("big")) * 200
        sent = threading.Thread(target=lambda: _send_quietly(flood.sock, frames), daemon=True)
        sent.start()
        time.sleep(2)  # the server reads what it can, then stops reading this connection
        rss = store.rss_mib()
        print("      store RSS %.0f MiB before the flood, %.0f MiB during it" % (rss_before, rss))
        check(rss < rss_before + 48, "RSS stays bounded under the no-read flood (< +48 MiB)")
        stored_and_served(store.port, big)
        check(store.proc.poll() is None, "the store is still running")
        flood.close()
    finally:
        store.stop()


def _send_quietly(sock, data):
    try:
        sock.sendall(data)
    except OSError:
        pass


def unauthenticated_oversized_frame():
    """Attacks the store before authentication: with a token set, a frame announcing a 60 MiB
    value, and its bytes, from a peer that never authenticated. It must be closed from the
    command byte, without buffering the value."""
    with tempfile.NamedTemporaryFile("w", delete=False) as f:
        f.write("a-token-of-32-bytes-0123456789ab")
        token_file = f.name
    os.chmod(token_file, 0o600)
    store = Store("--auth-token-file", token_file)
    try:
        rss_before = store.rss_mib()
        attacker = socket.create_connection(("127.0.0.1", store.port))
        header = bytes([LEG_SET]) + s("k") + struct.pack("<Q", 60 * MiB)
        _send_quietly(attacker, header + b"x" * (4 * MiB))
        c = Client(store.port)
        check(closed_by_peer(attacker, 5),
              "the unauthenticated oversized frame closes its connection")
        check(store.rss_mib() < rss_before + 16, "nothing of the value was buffered")
        check("SET before authenticating" in store.log_text(),
              "the log names the peer and the refused command")
        # The store still answers a handshake (what an unauthenticated client may do).
        c.sock.sendall(bytes([HELLO]))
        (n,) = struct.unpack("<Q", c.recv(8))
        check(c.recv(n).startswith(b"ddprun-store/"), "another client is served (HELLO answered)")
    finally:
        store.stop()
        os.unlink(token_file)


def byte_a_second_sender():
    """Attacks the store's time: a client that sends a SET frame one byte a second. It is cut
    at the frame deadline (--frame-timeout 3), and other clients are served meanwhile."""
    store = Store("--frame-timeout", "3")
    try:
        store_before(store.port)
        slow = socket.create_connection(("127.0.0.1", store.port))
        slow.sendall(bytes([LEG_SET]) + s("slow") + struct.pack("<Q", 100))
        start = time.monotonic()
        cut = False
        while time.monotonic() - start < 20 and not cut:
            try:
                slow.sendall(b"x")
            except OSError:
                cut = True
                break
            stored_and_served(store.port)
            cut = closed_by_peer(slow, 1)
        took = time.monotonic() - start
        check(cut, "the byte-a-second sender is cut (after %.1f s)" % took)
        check("did not complete a frame within 3 s" in store.log_text(),
              "the log says why, naming frame_timeout")
        check(Client(store.port).get("slow") == b"", "nothing of its frame was stored")
        stored_and_served(store.port)
    finally:
        store.stop()


def descriptor_exhaustion():
    """Attacks the store's descriptors: with `ulimit -n 64`, connections until none is left,
    then hundreds more. Each is refused at once (not left hanging), a ddprun agent that tries
    to join gets a clear message, and the log is not flooded; once the attackers leave the
    store serves again with its keys intact."""
    store = Store(limit_fds=64)
    try:
        store_before(store.port)
        start = time.monotonic()
        held = []
        for _ in range(80):
            try:
                held.append(socket.create_connection(("127.0.0.1", store.port), timeout=5))
            except OSError:
                break
        refused = 0
        for _ in range(300):
            try:
                c = Client(store.port, timeout=5)
                c.get("before")
            except (OSError, ConnectionError):
                refused += 1
        check(refused == 300, "every connection past the limit is refused (%d of 300)" % refused)
        agent = subprocess.run(
            [os.path.join(BIN, "ddprun"), "--nnodes=2", "--nproc-per-node=1",
             "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:%d" % store.port,
             "--rdzv-conf=is_host=false,join_timeout=10,read_timeout=10", "true"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        out = agent.stdout.decode(errors="replace")
        print("      the agent said: " + (out.strip().splitlines() or ["(nothing)"])[-1])
        check(agent.returncode != 0 and "connection or descriptor limit" in out,
              "a ddprun agent fails with a clear message")
        lines = [l for l in store.log_text().splitlines() if "out of file descriptors" in l]
        # Rate-limited: at most 10 such lines per 10 s window the attack spanned.
        bound = 10 * (int((time.monotonic() - start) / 10) + 2)
        check(0 < len(lines) <= bound, "the log is not flooded (%d lines for %d refusals, "
              "at most %d allowed)" % (len(lines), refused, bound))
        for h in held:
            h.close()
        time.sleep(0.5)
        stored_and_served(store.port)
    finally:
        store.stop()


ATTACKS = {f.__name__: f for f in (no_read_flood, unauthenticated_oversized_frame,
                                   byte_a_second_sender, descriptor_exhaustion)}


def main():
    names = sys.argv[1:] or list(ATTACKS)
    for name in names:
        print("== %s: %s" % (name, " ".join(ATTACKS[name].__doc__.split())), flush=True)
        ATTACKS[name]()
    if failures:
        print("FAILED: %d check(s)" % len(failures))
        return 1
    print("all attacks held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
