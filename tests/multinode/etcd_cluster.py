"""A real etcd cluster for a multi-node test: N members of Debian's etcd-server on free
loopback ports, each with its own data directory under the test's directory, started as child
processes and stopped by pid (SIGKILL) at cleanup. Nothing else on the machine is touched."""
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def installed():
    return os.access(ETCD, os.X_OK)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdCluster:
    def __init__(self, directory, members=3):
        self.dir = directory
        self.members = [{"name": "m%d" % i, "client": _free_port(), "peer": _free_port(),
                         "proc": None} for i in range(members)]
        self.initial = ",".join("%s=http://127.0.0.1:%d" % (m["name"], m["peer"])
                                for m in self.members)
        for i in range(members):
            self.start(i, "new")
        self.wait_for_leader(30)

    def endpoints(self):
        return ",".join("127.0.0.1:%d" % m["client"] for m in self.members)

    def start(self, i, state="existing"):
        m = self.members[i]
        client = "http://127.0.0.1:%d" % m["client"]
        peer = "http://127.0.0.1:%d" % m["peer"]
        log = open(os.path.join(self.dir, "%s.log" % m["name"]), "a")
        m["proc"] = subprocess.Popen(
            [ETCD, "--name", m["name"], "--data-dir", os.path.join(self.dir, m["name"]),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", self.initial, "--initial-cluster-state", state,
             "--initial-cluster-token", "ddprun-test"],
            stdout=log, stderr=subprocess.STDOUT)

    def kill(self, i):
        p = self.members[i]["proc"]
        if p and p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()
        self.members[i]["proc"] = None

    def stop(self):
        for i in range(len(self.members)):
            self.kill(i)

    def alive(self, i):
        p = self.members[i]["proc"]
        return p is not None and p.poll() is None

    def status(self, i, timeout=2.0):
        req = urllib.request.Request("http://127.0.0.1:%d/v3/maintenance/status"
                                     % self.members[i]["client"], data=b"{}", method="POST")
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.load(r)

    def leader(self):
        """The index of the member that leads (maintenance/status: leader == member_id)."""
        for i in range(len(self.members)):
            if not self.alive(i):
                continue
            try:
                s = self.status(i)
            except OSError:
                continue
            if s.get("leader") and s["leader"] == s["header"]["member_id"]:
                return i
        return -1

    def wait_for_leader(self, timeout):
        deadline = time.time() + timeout
        while self.leader() < 0:
            if time.time() > deadline:
                raise RuntimeError("etcd cluster in %s elected no leader" % self.dir)
            time.sleep(0.05)

    def get_prefix(self, prefix):
        """Keys under `prefix` (decoded), through the v3 gateway of any live member."""
        import base64
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        body = json.dumps({"key": base64.b64encode(prefix.encode()).decode(),
                           "range_end": base64.b64encode(end.encode()).decode(),
                           "keys_only": True}).encode()
        for m in self.members:
            if not m["proc"]:
                continue
            try:
                req = urllib.request.Request("http://127.0.0.1:%d/v3/kv/range" % m["client"],
                                             data=body, method="POST")
                with urllib.request.urlopen(req, timeout=5) as r:
                    kvs = json.load(r).get("kvs", [])
                return [base64.b64decode(kv["key"]).decode() for kv in kvs]
            except OSError:
                continue
        raise RuntimeError("no etcd member answers")
