"""A private Slurm cluster on this machine for the tests: munged with its own key and socket,
slurmctld, and two slurmd (-N n1, -N n2) whose nodes have NodeAddr 127.0.0.2 and 127.0.0.3,
each daemon on a free port, every file in the test's temporary directory. Needs root and
Debian's slurm-wlm + munge; start() returns None (after printing one SKIP line saying why)
where the daemons cannot start. stop() ends only the daemons it started."""
import os
import random
import shutil
import signal
import socket
import subprocess
import time

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "scontrol", "sinfo")


def _free_port():
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, root):
        self.root = root
        self.procs = []  # (name, Popen) of every daemon started here
        self.conf = os.path.join(root, "slurm.conf")
        self.sock = os.path.join(root, "munge", "munge.socket")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        for k in list(self.env):  # a test run inside a Slurm job must not leak into this one
            if k.startswith("SLURM_") and k != "SLURM_CONF":
                del self.env[k]

    def srun_prefix(self, nodes):
        return ["srun", "-N%d" % nodes, "--ntasks-per-node=1", "--time=5"]

    def _spawn(self, name, cmd):
        log = open(os.path.join(self.root, name + ".out"), "w")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                             start_new_session=True)
        self.procs.append((name, p))
        return p

    def _log_tail(self, name, n=3):
        path = os.path.join(self.root, name)
        if not os.path.exists(path):
            return ""
        with open(path, errors="replace") as f:
            return " | ".join(l.strip() for l in f.read().splitlines()[-n:])

    def _write_config(self):
        host = socket.gethostname().split(".")[0]
        d = self.root
        os.makedirs(os.path.join(d, "state"))
        os.makedirs(os.path.join(d, "spool"))
        lines = [
            "ClusterName=ddprun%d" % os.getpid(),
            "SlurmctldHost=%s(127.0.0.1)" % host,
            "SlurmctldPort=%d" % _free_port(),
            "AuthType=auth/munge",
            "AuthInfo=socket=%s" % self.sock,
            "CredType=cred/munge",
            "SlurmUser=root",
            "SlurmdUser=root",
            "StateSaveLocation=%s/state" % d,
            "SlurmdSpoolDir=%s/spool/%%n" % d,
            "SlurmctldPidFile=%s/slurmctld.pid" % d,
            "SlurmdPidFile=%s/slurmd-%%n.pid" % d,
            "SlurmctldLogFile=%s/slurmctld.log" % d,
            "SlurmdLogFile=%s/slurmd-%%n.log" % d,
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmdTimeout=30",
            "FirstJobId=%d" % random.randint(1000, 900000),
            "NodeName=n1 NodeAddr=127.0.0.2 NodeHostName=%s Port=%d CPUs=2 State=UNKNOWN"
            % (host, _free_port()),
            "NodeName=n2 NodeAddr=127.0.0.3 NodeHostName=%s Port=%d CPUs=2 State=UNKNOWN"
            % (host, _free_port()),
            "PartitionName=test Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP",
        ]
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")

    def _start_munge(self):
        m = os.path.join(self.root, "munge")
        os.makedirs(m, mode=0o700)
        key = os.path.join(m, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self._spawn("munged", ["munged", "--foreground", "--force", "--socket=" + self.sock,
                               "--key-file=" + key, "--log-file=" + os.path.join(m, "munged.log"),
                               "--pid-file=" + os.path.join(m, "munged.pid"),
                               "--seed-file=" + os.path.join(m, "munged.seed")])

    def _wait(self, what, pred, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for name, p in self.procs:
                if p.poll() is not None:
                    return "%s exited with %s: %s" % (name, p.returncode,
                                                      self._log_tail(name + ".out"))
            if pred():
                return None
            time.sleep(0.1)
        return "%s not within %d s" % (what, timeout)

    def _nodes_idle(self):
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True,
                           env=self.env, timeout=10)
        states = dict(l.split() for l in r.stdout.splitlines() if len(l.split()) == 2)
        return states.get("n1") == "idle" and states.get("n2") == "idle"

    def start(self):
        """None when the cluster is up, else why not."""
        self._write_config()
        self._start_munge()
        why = self._wait("munged's socket", lambda: os.path.exists(self.sock), 10)
        if why:
            return why
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", self.conf])
        for n in ("n1", "n2"):
            self._spawn("slurmd-" + n, ["slurmd", "-D", "-N", n, "-f", self.conf])
        why = self._wait("both nodes idle", self._nodes_idle, 60)
        if why:
            return why + " (slurmctld: %s)" % self._log_tail("slurmctld.log")
        return None

    def stop(self):
        try:
            subprocess.run(["scontrol", "shutdown"], env=self.env, capture_output=True,
                           timeout=10)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.time() + 10
        for name, p in reversed(self.procs):
            if name != "munged":
                try:
                    p.wait(timeout=max(0.1, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    pass
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()


def start(root):
    """A running Cluster in root/slurm, or None after printing why it cannot run here."""
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        from harness import skip_unless_ci  # under CI=true a missing package is a failure
        skip_unless_ci("Slurm is not installed (no %s): scripts/setup installs slurm-wlm and "
                       "munge" % ", ".join(missing))
        return None
    if os.geteuid() != 0:
        print("SKIP: a private Slurm cluster needs root (slurmd runs jobs as their users); "
              "running as uid %d" % os.geteuid())
        return None
    c = Cluster(os.path.join(root, "slurm"))
    os.makedirs(c.root)
    why = c.start()
    if why:
        c.stop()
        print("SKIP: the test's Slurm daemons cannot start here: %s (logs in %s)" % (why, c.root))
        return None
    return c
