"""Real PyTorch 1.13 workers (Debian's python3-torch) under the real ddprun.

- a DDP training script (gloo, CPU) in both store modes: the agent's store (PyTorch workers
  are TCPStore clients of it) and --no-agent-store (rank 0 hosts its own TCPStore);
- a restart after a worker failure, with the agent's store: the new attempt must get fresh
  keys (PyTorch prefixes them with TORCHELASTIC_RESTART_COUNT);
- @record's error file in ddprun's failure report, and in ddprun's own TORCHELASTIC_ERROR_FILE
  (with a worker killed by a signal: a generated record);
- a script for the old torch.distributed.launch reading --local_rank (--pass-local-rank).
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "workers")
DDPRUN = os.path.join(os.environ["DDPRUN_BIN"], "ddprun")
ENV = dict(os.environ, PYTHON_EXEC=sys.executable, OMP_NUM_THREADS="1")


def ddprun(*args, timeout=240, env=ENV):
    # On a timeout ddprun gets SIGTERM (it stops its workers and says where each one was) and
    # what it printed is shown before the test fails: a hang leaves a trace to read.
    proc = subprocess.Popen([DDPRUN, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            stdout, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        print(f"$ ddprun {' '.join(args)}\n  TIMED OUT after {timeout} s\n{stdout}{stderr}", flush=True)
        raise AssertionError(f"ddprun {' '.join(args)} did not end within {timeout} s")
    print(f"$ ddprun {' '.join(args)}\n  exit {proc.returncode}\n{stdout}{stderr}", flush=True)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def test_ddp(store_flags, label):
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "ckpt.pt")
        proc = ddprun("--standalone", "--nproc-per-node=2", *store_flags,
                      os.path.join(WORKERS, "ddp_train.py"), "--checkpoint", ckpt, "--epochs", "2")
        check(proc.returncode == 0, f"{label}: exit {proc.returncode}")
        for rank in (0, 1):
            check(f"[rank {rank}]: rank {rank}/2 attempt 0:" in proc.stdout, f"{label}: rank {rank} done")
        check(f"store {label}" in proc.stdout, f"{label}: workers used the expected store")
        state = torch.load(ckpt)
        check(state["world_size"] == 2 and state["epochs"] == 2, f"{label}: checkpoint contents")
        check(set(state["model"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}, "model keys")


def test_restart_with_agent_store():
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "ckpt.pt")
        proc = ddprun("--standalone", "--nproc-per-node=2", "--max-restarts=1",
                      os.path.join(WORKERS, "ddp_train.py"), "--checkpoint", ckpt, "--epochs", "1",
                      "--fail-once-rank", "1")
        check(proc.returncode == 0, f"restart: exit {proc.returncode}")
        check("injected failure on rank 1, attempt 0" in proc.stderr, "the failure was seen")
        check("restart 1 of 1" in proc.stderr, "the group was restarted")
        check("[rank 1]: rank 1/2 attempt 1:" in proc.stdout, "rank 1 finished attempt 1")
        check(torch.load(ckpt)["attempt"] == 1, "the checkpoint comes from attempt 1")


def test_record_error_file():
    with tempfile.TemporaryDirectory() as tmp:
        # ddprun's own error file, as a job scheduler sets it for torchrun.
        own = os.path.join(tmp, "launcher-error.json")
        env = dict(ENV, TORCHELASTIC_ERROR_FILE=own)
        proc = ddprun("--standalone", "--nproc-per-node=2", os.path.join(WORKERS, "record_failure.py"),
                      env=env)
        check(proc.returncode == 1, f"@record: exit {proc.returncode}")
        check("rank       : 1 (local rank 1)" in proc.stderr, "root cause is rank 1")
        check("message    : ValueError: corrupt batch at step 17" in proc.stderr, "error file message")
        check("in load_batch" in proc.stderr, "error file traceback")
        # The path the report names still exists (the failed job's run directory is kept).
        worker_file = re.search(r"error file : (\S+error\.json)", proc.stderr).group(1)
        with open(worker_file) as f:
            check("corrupt batch at step 17" in f.read(), "the reported error file holds the error")
        with open(own) as f:
            record = json.load(f)
        check(record["message"]["message"] == "ValueError: corrupt batch at step 17",
              f"ddprun's error file: the worker's message: {record}")
        check(record["message"]["errorCode"] == 1, "ddprun's error file: the worker's exit code")
        check("in load_batch" in record["message"]["extraInfo"]["py_callstack"], "its traceback")
        # A worker that dies by a signal writes nothing: ddprun generates the record.
        os.unlink(own)
        proc = ddprun("--standalone", "--nproc-per-node=1", sys.executable, "-c",
                      "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", env=env)
        check(proc.returncode == 137, f"SIGKILL: exit {proc.returncode}")
        with open(own) as f:
            record = json.load(f)
        check(re.fullmatch(r"Signal 9 \(SIGKILL\) received by PID \d+", record["message"]["message"]),
              f"generated record names the signal: {record}")
        check(record["message"]["errorCode"] == 137, "generated record: exit code")


def test_pass_local_rank():
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "seen")
        proc = ddprun("--standalone", "--nproc-per-node=2", "--pass-local-rank",
                      os.path.join(WORKERS, "local_rank_arg.py"), "--out", out)
        check(proc.returncode == 0, f"--pass-local-rank: exit {proc.returncode}")
        for rank in (0, 1):
            with open(f"{out}.{rank}") as f:
                check(f.read() == f"{rank} {rank}\n", f"rank {rank} read --local_rank")
        bare = ddprun("--standalone", "--nproc-per-node=2", os.path.join(WORKERS, "local_rank_arg.py"),
                      "--out", out)
        check(bare.returncode == 2, "without --pass-local-rank argparse rejects the call")


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    if which in ("ddp", "all"):
        test_ddp([], "agent")
        test_ddp(["--no-agent-store"], "own")
    if which in ("restart", "all"):
        test_restart_with_agent_store()
    if which in ("misc", "all"):
        test_record_error_file()
        test_pass_local_rank()
    print("OK")
