"""Every ddprun-bench subcommand, run with tiny sizes: the tables in the README come from code
that is tested. For each benchmark: exit 0, a CSV written where --csv says, every row of it
naming both ddprun and its peer (or a ratio), and every measured number finite and positive.

Speed is not checked here (that is what the benchmarks are for); only that they run and
report. Usage: bench_smoke_test.py BENCHMARK   (store, launch, rendezvous, rendezvous-simulate,
rendezvous-simulate-etcd, allreduce, train, recovery, recovery-split, recovery-split-shrink)
"""
import csv
import math
import os
import subprocess
import sys
import tempfile

BENCH = os.path.join(os.environ["DDPRUN_BIN"], "ddprun-bench")

# Tiny sizes: each run takes seconds, not minutes.
ARGS = {
    "store": ["--ops", "200", "--barrier", "8"],
    "launch": ["--runs", "2", "--torchrun-runs", "1", "--no-default-interval"],
    "rendezvous": ["--sizes", "2", "--repeat", "1", "--only", "form"],
    # simulated agents (issue 20): today's protocol and the slot join, side by side
    "rendezvous-simulate": ["--simulate", "16,64", "--protocol", "log,slots", "--no-plot"],
    # the same agents' code on the etcd backend, against a private etcd (skipped without etcd)
    "rendezvous-simulate-etcd": ["--simulate", "16", "--backend", "etcd-v3", "--no-plot"],
    "allreduce": ["--ranks", "2", "--min-bytes", "4096", "--max-bytes", "16384",
                  "--seconds", "0.05"],
    "train": ["--model", "mlp", "--nproc", "2", "--steps", "20", "--repeat", "1", "--timeline"],
    # one kill of a 2-rank job, ddprun restarting and torchrun restarting (both lose seconds)
    "recovery": ["--nproc", "2", "--modes", "restart,torchrun", "--repeats", "1", "--kills", "1",
                 "--steps", "60", "--checkpoint-interval", "10", "--train-limit", "4096"],
    # with timelines: where an in-process recovery's lost time goes (the kill near step 50 leaves
    # its window, 20 steps past the recovery, inside the run)
    "recovery-split": ["--nproc", "2", "--modes", "in-process", "--repeats", "1", "--kills", "1",
                       "--steps", "100", "--checkpoint-interval", "10", "--train-limit", "4096",
                       "--timeline-split"],
    # the same for a shrink that a loaded spare grows back, split by samples (the window ends 20
    # steps after the group is whole again; the kill waits for the spare, so a longer run)
    "recovery-split-shrink": ["--nproc", "2", "--modes", "shrink-spare", "--repeats", "1",
                              "--kills", "1", "--kill-when-spare-ready", "--steps", "400",
                              "--checkpoint-interval", "10", "--train-limit", "4096",
                              "--timeline-split"],
}
# Words that name ddprun's side and the peer's in each benchmark's CSV.
PEERS = {
    "store": ("ddprun", "torch"),
    "launch": ("ddprun", "torchrun"),
    "rendezvous": ("ddprun", "torchrun"),
    "rendezvous-simulate": ("simulate-log", "simulate-slots"),
    "rendezvous-simulate-etcd": ("simulate-etcd-agents", "simulate-etcd-agents"),
    "allreduce": ("ddprun", "gloo"),
    "train": ("ddprun", "pytorch"),
    "recovery": ("ddprun-restart", "torchrun"),
    "recovery-split": ("ddprun-in-process", "ddprun-in-process"),
    "recovery-split-shrink": ("ddprun-shrink-spare", "ddprun-shrink-spare"),
}


def numbers(rows):
    """Every cell that parses as a number."""
    for row in rows:
        for cell in row:
            try:
                yield float(cell.rstrip("x"))
            except ValueError:
                pass


def main():
    name = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, f"{name}.csv")
        cmd = [BENCH, name.split("-")[0], *ARGS[name], "--csv", out]
        if name.startswith(("train", "recovery")):
            cmd += ["--work-dir", os.path.join(tmp, "work")]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp)
        print(proc.stdout[-3000:])
        print(proc.stderr[-3000:], file=sys.stderr)
        if proc.returncode == 77 and name == "rendezvous-simulate-etcd":
            print("SKIP: etcd is not installed")  # said by the bench on stderr
            sys.exit(77)
        assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}"
        assert os.path.exists(out), f"ddprun-bench {name} wrote no {out}"
        with open(out) as f:
            text = f.read()
        rows = [r for r in csv.reader(line for line in text.splitlines()
                                      if line and not line.startswith("#"))]
        assert len(rows) >= 2, f"{out} has no data rows:\n{text}"
        ours, theirs = PEERS[name]
        assert ours in text, f"{out} has no {ours} measurement:\n{text}"
        assert theirs in text.lower(), f"{out} has no {theirs} measurement:\n{text}"
        values = list(numbers(rows[1:]))
        assert values, f"{out} holds no numbers:\n{text}"
        # Time lost per failure is a killed run less its undisturbed twin: on a busy machine
        # the killed one can finish first, so those columns may be negative, never non-finite.
        signed = {i for i, h in enumerate(rows[0]) if h.startswith("lost")}
        bad = [v for v in values if not math.isfinite(v)]
        bad += [v for v in numbers([[c for i, c in enumerate(r) if i not in signed]
                                    for r in rows[1:]]) if v < 0]
        assert not bad, f"{out} holds non-finite or negative numbers {bad}:\n{text}"
        if name.startswith("rendezvous-simulate"):  # every size formed and re-formed
            for row in rows[1:]:
                assert row[2] and row[3], f"{out}: no form or re-form time in {row}"
        if name == "train":  # the timeline's cost: a third side and its ratio
            assert "ddprun+timeline" in text and "timeline_ratio" in text, \
                f"{out} has no --timeline measurement:\n{text}"
        if name == "rendezvous":  # "form" (the last agent's round-closed line) within "form+run"
            by = {r[0]: r for r in rows[1:]}
            assert "form" in by and "form+run" in by, f"{out} lacks the form rows:\n{text}"
            formed, whole = float(by["form"][2]), float(by["form+run"][2])
            assert 0 < formed <= whole, \
                f"{out}: form {formed} s is not within form+run {whole} s:\n{text}"
        if name.startswith("recovery-split"):  # the split table has the mode's row, all parts
            label = "| ddprun " + ARGS[name][ARGS[name].index("--modes") + 1]
            row = [l for l in proc.stdout.splitlines()
                   if l.startswith(label + " ") and l.count("/") == 4]
            assert "where the time lost per failure goes" in proc.stdout and len(row) == 1, \
                f"no split of the {label[2:]} recovery's lost time:\n{proc.stdout}"
        print(f"ok: ddprun-bench {name}: {len(rows) - 1} rows, {len(values)} numbers")


if __name__ == "__main__":
    main()
