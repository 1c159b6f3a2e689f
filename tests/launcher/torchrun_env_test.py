"""ddprun's worker environment against real torchrun's (torch 1.13 through
bench/torchrun_wrapper.py), variable for variable, for 1, 2 and 4 workers.

Both launchers start /bin/sh workers that save /proc/self/environ. The launchers run with
the same minimal environment, so what each one adds can be compared exactly.

- static backend (torchrun's default), both on the same --master-port: every variable and
  every value must be equal, except TORCHELASTIC_ERROR_FILE (each launcher's own log
  directory; the same .../attempt_0/<local_rank>/error.json layout) and
  TORCH_NCCL_ASYNC_ERROR_HANDLING, which ddprun adds for torch >= 2.2 (1.13 reads the older
  NCCL_ASYNC_ERROR_HANDLING, which both set).
- --standalone: the same variables; by design different values for MASTER_ADDR (ddprun
  names the loopback address its store is bound to, torchrun says "localhost"), MASTER_PORT
  and TORCHELASTIC_RUN_ID (both random), and TORCHELASTIC_USE_AGENT_STORE (ddprun's agent
  hosts the store; with --no-agent-store ddprun matches torchrun's False).
"""
import os
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
WRAPPER = os.path.join(HERE, "..", "..", "bench", "torchrun_wrapper.py")
DDPRUN = os.path.join(os.environ["DDPRUN_BIN"], "ddprun")
BASE = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "FOO": "bar"}
# ddprun adds these: the newer NCCL variable, and the progress file of --stall-warning.
DDPRUN_ONLY = {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "DDPRUN_PROGRESS_FILE", "DDPRUN_PROGRESS_SLOT",
               "DDPRUN_RECOVERY"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_envs(launcher, nproc):
    """Runs `launcher` (argv up to PROGRAM) and returns the environment each worker got."""
    with tempfile.TemporaryDirectory() as out:
        worker = ["/bin/sh", "-c", f"exec cat /proc/self/environ > {out}/env.$LOCAL_RANK"]
        proc = subprocess.run(launcher + worker, env=BASE, capture_output=True, text=True,
                              timeout=120, cwd=out)
        if proc.returncode != 0:
            raise AssertionError(f"{launcher[:2]} failed ({proc.returncode}):\n{proc.stderr}")
        envs = []
        for rank in range(nproc):
            with open(f"{out}/env.{rank}") as f:
                pairs = [e.split("=", 1) for e in f.read().split("\0") if e]
            env = dict(pairs)
            # What the launcher added: /bin/sh itself exports PWD.
            envs.append({k: v for k, v in env.items() if k not in BASE and k != "PWD"})
            for k, v in BASE.items():
                assert env[k] == v, f"{k} of the launcher's environment must reach the worker"
        return envs


def torchrun(*flags):
    return [sys.executable, WRAPPER, "--monitor_interval=0.1", *flags, "--no_python"]


def compare(label, theirs, ours, differ=()):
    for rank, (t, o) in enumerate(zip(theirs, ours)):
        assert set(o) == set(t) | DDPRUN_ONLY, (
            f"{label} rank {rank}: variables differ: torchrun only {sorted(set(t) - set(o))}, "
            f"ddprun only {sorted(set(o) - set(t) - DDPRUN_ONLY)}")
        assert o["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
        for key in t:
            suffix = f"/attempt_0/{rank}/error.json"
            if key == "TORCHELASTIC_ERROR_FILE":
                assert t[key].endswith(suffix) and o[key].endswith(suffix), (t[key], o[key])
            elif key not in differ:
                assert o[key] == t[key], f"{label} rank {rank}: {key}: torchrun {t[key]!r}, ddprun {o[key]!r}"
        print(f"{label} rank {rank}: {len(o)} variables match torchrun's", flush=True)


def main():
    for nproc in (1, 2, 4):
        port = str(free_port())
        theirs = worker_envs(torchrun(f"--nproc_per_node={nproc}", f"--master_port={port}"), nproc)
        ours = worker_envs([DDPRUN, f"--nproc-per-node={nproc}", f"--master-port={port}"], nproc)
        compare(f"static, {nproc} workers", theirs, ours)

    theirs = worker_envs(torchrun("--standalone", "--nproc_per_node=2"), 2)
    ours = worker_envs([DDPRUN, "--standalone", "--nproc-per-node=2"], 2)
    compare("standalone", theirs, ours,
            differ={"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE"})
    assert [e["TORCHELASTIC_USE_AGENT_STORE"] for e in theirs + ours] == ["False"] * 2 + ["True"] * 2
    own = worker_envs([DDPRUN, "--standalone", "--no-agent-store", "--nproc-per-node=2"], 2)
    compare("standalone --no-agent-store", theirs, own,
            differ={"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"})
    print("OK")


if __name__ == "__main__":
    main()
