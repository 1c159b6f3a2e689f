"""ddprun under Slurm with no rendezvous flags. Usage: slurm_scenarios.py NAME (exit 0/1/77).

  simulated  two "nodes" on 127.0.0.3 and 127.0.0.2 with the variables srun sets
  steps      two steps of one job at once on the same two "nodes" (`srun ... &` twice in a
             batch script): each its own store and run id, both succeed
  real       a real Slurm cluster on this machine: a private munged, slurmctld and two
             slurmd (n1, n2 at 127.0.0.2 and .3), all started here in a temporary directory
             (slurm_cluster.py); `srun -N2 --ntasks-per-node=1 ddprun --nproc-per-node=2`
"""
import os
import random
import socket

from harness import DDPRUN, WORKER, SKIP, Node, check, run


def port_free(addr, port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((addr, port))
            return True
        except OSError:
            return False


def store_port(job, step):
    """ddprun's store port for a Slurm step (launcher/cluster/slurm.h)."""
    return 29400 + (job % 1000 * 10 + step % 1000) % 1000


def free_job_id(addr, steps=1):
    """A job id whose first `steps` store ports are free on `addr` now."""
    for _ in range(200):
        job = random.randint(1000, 999999)
        if all(port_free(addr, store_port(job, s)) for s in range(steps)):
            return job
    raise RuntimeError("no free port in 29400..30399 on %s" % addr)


def slurm_env(t, job, step, node_id, addr):
    return {"SLURM_JOB_ID": str(job), "SLURM_STEP_ID": str(step), "SLURM_NNODES": "2",
            "SLURM_NODEID": str(node_id), "SLURM_JOB_NODELIST": "127.0.0.[3,2]",
            "SLURMD_NODENAME": addr, "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
            "SLURM_CONF": os.path.join(t.dir, "no-slurm.conf")}  # scontrol finds no cluster


def check_world_of_four(t, run_id, first_addr):
    starts = [r for r in t.starts() if r["TORCHELASTIC_RUN_ID"] == run_id]
    check(len(starts) == 4, "4 workers of run %s started (got %d)" % (run_id, len(starts)))
    check(sorted(int(r["RANK"]) for r in starts) == [0, 1, 2, 3], "global ranks 0..3")
    for r in starts:
        check(r["WORLD_SIZE"] == "4" and r["GROUP_WORLD_SIZE"] == "2", "world 4 on 2 nodes")
        check(r["MASTER_ADDR"] == first_addr, "MASTER_ADDR is the first node's address (%s)"
              % r["MASTER_ADDR"])


def simulated(t):
    """Node 0 is 127.0.0.3 (the first of the hostlist, so it hosts the store), node 1 is
    127.0.0.2: node ranks follow SLURM_NODEID, not the addresses' order."""
    job = free_job_id("127.0.0.3")
    nodes = []
    for node_id, addr in ((0, "127.0.0.3"), (1, "127.0.0.2")):
        env = slurm_env(t, job, 0, node_id, addr)
        name = "n%d" % node_id
        nodes.append(Node(t, name, ["--nproc-per-node=2", WORKER, "--out",
                                    os.path.join(t.out, name), "--run", "0.3"], env=env))
    for n in nodes:
        check(n.wait(60) == 0, "%s exit code %s" % (n.name, n.proc.returncode))
    check_world_of_four(t, "%d.0" % job, "127.0.0.3")
    check(sorted(int(r["RANK"]) for r in t.starts(node="n1")) == [2, 3],
          "SLURM_NODEID 1 has ranks 2, 3")
    check({r["GROUP_RANK"] for r in t.starts(node="n1")} == {"1"}, "node rank = SLURM_NODEID")
    line = [l for l in nodes[1].stderr().splitlines() if "taken from Slurm" in l]
    check(len(line) == 1, "one log line says what was taken from Slurm")
    print(line[0])
    for part in ("taken from Slurm step %d.0 (node 1 of 2, 127.0.0.2)" % job,
                 "--rdzv-endpoint=127.0.0.3:%d" % store_port(job, 0), "--nnodes=2",
                 "--rdzv-id=%d.0" % job, "--local-addr=127.0.0.2", "(node rank 1)"):
        check(part in line[0], "the log line has %r" % part)
    check("hosting the rendezvous store" in nodes[0].stderr(), "node 0 hosts the store")
    check("hosting the rendezvous store" not in nodes[1].stderr(), "node 1 does not")


def steps(t):
    """Two steps of one job at once, on the same nodes: before the step id was part of the
    store port and run id, the second step's node 0 could not bind the store (or, worse, its
    agents joined the first step's rendezvous)."""
    job = free_job_id("127.0.0.3", steps=2)
    nodes = []
    for step in (0, 1):
        for node_id, addr in ((0, "127.0.0.3"), (1, "127.0.0.2")):
            name = "s%d-n%d" % (step, node_id)
            nodes.append(Node(t, name, ["--nproc-per-node=2", WORKER, "--out",
                                        os.path.join(t.out, name), "--run", "1.0"],
                              env=slurm_env(t, job, step, node_id, addr)))
    for n in nodes:
        check(n.wait(60) == 0, "%s exit code %s" % (n.name, n.proc.returncode))
    for step in (0, 1):
        check_world_of_four(t, "%d.%d" % (job, step), "127.0.0.3")
        host = [n for n in nodes if n.name == "s%d-n0" % step][0]
        check("--rdzv-endpoint=127.0.0.3:%d" % store_port(job, step) in host.stderr(),
              "step %d's store is on its own port %d" % (step, store_port(job, step)))


def real(t):
    import slurm_cluster
    cluster = slurm_cluster.start(t.dir)
    if cluster is None:
        return SKIP
    try:
        out = os.path.join(t.out, "srun")
        n = Node(t, "srun", ["--nproc-per-node=2", WORKER, "--out", out, "--run", "0.3"],
                 env=cluster.env, prefix=cluster.srun_prefix(2))
        rc = n.wait(120)
        check(rc == 0, "srun exit code %s" % rc)
        starts = t.starts(node="srun")
        job = starts[0]["TORCHELASTIC_RUN_ID"] if starts else "?"
        check_world_of_four(t, job, "127.0.0.2")
        check(job.endswith(".0") and job[:-2].isdigit(),
              "run id is the Slurm step, JOB.0 (%s)" % job)
        check(n.stderr().count("taken from Slurm step %s" % job) == 2,
              "each node's ddprun logs what it took from Slurm")
        print([l for l in n.stderr().splitlines() if "taken from Slurm" in l][0])
    finally:
        cluster.stop()


if __name__ == "__main__":
    raise SystemExit(run({"simulated": simulated, "steps": steps, "real": real}))
