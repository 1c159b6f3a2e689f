"""Two ssh "hosts" on this machine for the tests: Debian's sshd started by the test with its
own host key, sshd_config and authorized_keys in the test's temporary directory, listening on
127.0.0.2 and 127.0.0.3 at a free port, plus an ssh client config (DDPRUN_SSH) that uses them.
start() returns None (after printing one SKIP line saying why) where sshd cannot run; stop()
ends only the sshd it started."""
import os
import shutil
import socket
import subprocess
import time

SSHD = "/usr/sbin/sshd"
HOSTS = ("127.0.0.2", "127.0.0.3")


def _free_port():
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.2", 0))
            port = s.getsockname()[1]
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.3", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no port free on both 127.0.0.2 and 127.0.0.3")


class Hosts:
    def __init__(self, root):
        self.root = root
        self.proc = None
        self.port = _free_port()
        self.client_config = os.path.join(root, "ssh_config")
        self.env = {"DDPRUN_SSH": "ssh -F %s" % self.client_config}

    def start(self):
        d = self.root
        for key in ("host_key", "id"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ddprun-test",
                            "-f", os.path.join(d, key)], check=True)
        shutil.copy(os.path.join(d, "id.pub"), os.path.join(d, "authorized_keys"))
        with open(os.path.join(d, "sshd_config"), "w") as f:
            f.write("\n".join([
                "Port %d" % self.port,
                "ListenAddress 127.0.0.2",
                "ListenAddress 127.0.0.3",
                "HostKey %s/host_key" % d,
                "AuthorizedKeysFile %s/authorized_keys" % d,
                "PidFile %s/sshd.pid" % d,
                "StrictModes no",
                "UsePAM no",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PubkeyAuthentication yes",
                "MaxStartups 50:30:100",
                "LogLevel ERROR",
            ]) + "\n")
        with open(self.client_config, "w") as f:
            f.write("\n".join([
                "Host *",
                "  Port %d" % self.port,
                "  User %s" % os.environ.get("USER", "root"),
                "  IdentityFile %s/id" % d,
                "  IdentitiesOnly yes",
                "  StrictHostKeyChecking no",
                "  UserKnownHostsFile /dev/null",
                "  LogLevel ERROR",
                "  ConnectTimeout 10",
            ]) + "\n")
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        log = open(os.path.join(d, "sshd.log"), "w")
        self.proc = subprocess.Popen([SSHD, "-D", "-f", os.path.join(d, "sshd_config"),
                                      "-E", os.path.join(d, "sshd.log")],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 10
        while time.time() < deadline:
            if self.proc.poll() is not None:
                with open(os.path.join(d, "sshd.log")) as f:
                    return "sshd exited with %s: %s" % (self.proc.returncode, f.read().strip())
            if all(self._listening(h) for h in HOSTS):
                return self._login_works()
            time.sleep(0.05)
        return "sshd is not listening on %s port %d within 10 s" % (" and ".join(HOSTS), self.port)

    def _listening(self, host):
        try:
            socket.create_connection((host, self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def _login_works(self):
        r = subprocess.run(["ssh", "-F", self.client_config, "-o", "BatchMode=yes", HOSTS[1],
                            "echo ok"], capture_output=True, text=True, timeout=20)
        if r.stdout.strip() != "ok":
            return "ssh to %s fails: %s" % (HOSTS[1], r.stderr.strip())
        return None

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start(root):
    """Running Hosts in root/ssh, or None after printing why they cannot run here."""
    for tool in (SSHD, "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            from harness import skip_unless_ci  # under CI=true a missing package is a failure
            skip_unless_ci("%s is not installed: scripts/setup installs openssh-server and "
                           "openssh-client" % tool)
            return None
    if os.geteuid() != 0:
        print("SKIP: a private sshd needs root (uid %d)" % os.geteuid())
        return None
    h = Hosts(os.path.join(root, "ssh"))
    os.makedirs(h.root)
    why = h.start()
    if why:
        h.stop()
        print("SKIP: the test's sshd cannot run here: %s" % why)
        return None
    return h
