"""A program built on ddprun::runtime runs under torchrun (Debian's torch 1.13) too.

  --standalone        torch 1.13 gives TORCHELASTIC_USE_AGENT_STORE=False: rank 0 hosts the store
                      at MASTER_PORT (ddprun::init does what PyTorch's env:// init does);
  static rendezvous   USE_AGENT_STORE=True and the agent's store is torch's own TCPStore (1.13
                      framing): ddprun::init finds out it is not a ddprun-store and speaks torch's
                      protocol.
torchrun runs through bench/torchrun_wrapper.py (Debian's torchrun crashes under Python 3.11).
"""
import os
import socket
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
wrapper = os.path.join(here, "..", "..", "bench", "torchrun_wrapper.py")
worker = os.path.join(os.environ["DDPRUN_BIN"], "runtime_mp_worker")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(flags, n, mode):
    cmd = [sys.executable, wrapper, *flags, f"--nproc_per_node={n}", "--monitor_interval=0.1",
           "--no_python", worker, mode]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                       env=dict(os.environ, DDPRUN_LOG_LEVEL="debug"))
    out = p.stdout + p.stderr
    ok = p.returncode == 0 and all(f"rank {r}/{n} {mode} OK" in out for r in range(n))
    print(("PASS" if ok else "FAIL"), " ".join(flags), n, mode)
    if not ok:
        print(out[-3000:])
        sys.exit(1)
    return out


run(["--standalone"], 2, "ddp")
run(["--standalone"], 3, "ddp")
out = run(["--rdzv_backend=static", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
           "--nnodes=1", "--node_rank=0"], 2, "ddp")
if "torch 1.13 TCPStore protocol" not in out:
    print("FAIL: expected the runtime to detect torch's agent store (legacy framing)")
    print(out[-3000:])
    sys.exit(1)
print("OK: ddprun::runtime programs run under torchrun, with its agent store and without")
