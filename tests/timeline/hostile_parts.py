"""A worker attacks the agent's timeline merge through its part files (docs/security.md): the
merge reads them as hostile input. One job under `ddprun --timeline=FILE` whose worker writes,
next to its own part file:
  deep.jsonl   an event nested 500,000 brackets deep (recursive JSON code would overflow the
               agent's stack: before the depth bound, ddprun died of SIGSEGV)
  fifo.jsonl   a FIFO (opening it for reading would wait for a writer forever)
  zero.jsonl   a symlink to /dev/zero (endless)
  huge-a/b     two 300 MiB lines without a newline (sparse files): past the bound per file
               (256 MiB) and for the whole merge (512 MiB)
  types.jsonl  events whose tid and dur are strings, then one good event
  badstart     a header whose start_us is a string
ddprun must exit 0 with a valid trace that keeps the good event and the agent's track, counts
what it skipped and cut, and stays within a bounded memory. Then ddprun-trace is given a trace
nested 300,000 deep and must refuse it with a message.
Usage: hostile_parts.py   (exit 0 pass, 1 fail)
"""
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

BIN = os.environ.get("DDPRUN_BIN", os.path.join(os.path.dirname(__file__), "../../build/bin"))

WORKER = r'''
import os, time
d = os.environ["DDPRUN_TIMELINE_DIR"]
now = int(time.time() * 1e6)
def header(start):
    return '{"track":"rank 0","pid":%d,"start_us":%s}\n' % (os.getpid(), start)
with open(os.path.join(d, "deep.jsonl"), "w") as f:
    f.write(header(now))
    f.write('{"ph":"i","ts":%d,"name":"deep","args":%s%s}\n' % (now, "[" * 500000, "]" * 500000))
os.mkfifo(os.path.join(d, "fifo.jsonl"))
os.symlink("/dev/zero", os.path.join(d, "zero.jsonl"))
for name in ("huge-a.jsonl", "huge-b.jsonl"):
    with open(os.path.join(d, name), "w") as f:
        f.write(header(now))
        f.truncate(300 << 20)
with open(os.path.join(d, "types.jsonl"), "w") as f:
    f.write(header(now))
    f.write('{"ph":"i","ts":%d,"tid":"x","name":"bad tid"}\n' % now)
    f.write('{"ph":"X","ts":%d,"dur":"y","name":"bad dur"}\n' % now)
    f.write('{"ph":"i","ts":%d,"tid":1,"name":"survivor","args":{"ok":1}}\n' % (now + 1))
with open(os.path.join(d, "badstart.jsonl"), "w") as f:
    f.write('{"track":"rank 0","pid":1,"start_us":"soon"}\n')
    f.write('{"ph":"i","ts":%d,"tid":1,"name":"after a bad header"}\n' % now)
print("hostile part files written", flush=True)
'''


def main():
    failures = []

    def check(cond, what):
        print(("ok: " if cond else "FAILED: ") + what, flush=True)
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory(prefix="ddprun-hostile-parts-") as tmp:
        trace = os.path.join(tmp, "trace.json")
        cmd = [os.path.join(BIN, "ddprun"), "--standalone", "--nproc-per-node=1",
               "--timeline=" + trace, sys.executable, "-c", WORKER]
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        started = time.time()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=120)
        print(p.stdout)
        print("ddprun took %.1f s" % (time.time() - started))
        check(p.returncode == 0, "ddprun exits 0 (got %d)" % p.returncode)
        check("hostile part files written" in p.stdout, "the worker wrote its files")
        # ru_maxrss of the biggest child so far: ddprun (python and sh stay small).
        peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print("peak RSS of a child: %.0f MiB (before: %.0f MiB)" % (peak_mib, before / 1024))
        check(peak_mib < 1024, "ddprun's memory stays bounded (%.0f MiB < 1024 MiB)" % peak_mib)
        check("part file(s) read only in part" in p.stdout, "ddprun warns that parts were cut")
        with open(trace) as f:
            data = json.load(f)
        events = data["traceEvents"]
        names = {e.get("name") for e in events}
        tracks = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
        other = data["otherData"]
        print("tracks:", sorted(tracks), "otherData:", other)
        check(any(t.startswith("agent") for t in tracks), "the agent's track is there")
        check("survivor" in names, "the good event after the bad ones is kept")
        check("deep" not in names, "the deeply nested event is skipped")
        check(not ({"bad tid", "bad dur"} & names), "events with string tid/dur are skipped")
        check("after a bad header" not in names,
              "a part whose header has a string start_us is skipped, and the merge goes on")
        check(other["skipped_lines"] >= 3, "skipped lines are counted (%d)" % other["skipped_lines"])
        check(other["parts_cut"] >= 2, "both 300 MiB parts were cut (%d)" % other["parts_cut"])
        # ddprun-trace reads the merged trace; given a hostile one it refuses it clearly.
        deep = os.path.join(tmp, "deep.json")
        with open(deep, "w") as f:
            f.write('{"traceEvents":[{"args":%s%s}]}' % ("[" * 300000, "]" * 300000))
        t = subprocess.run([os.path.join(BIN, "ddprun-trace"), deep], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=60)
        print("ddprun-trace on a deep file:", t.returncode, t.stderr.strip())
        check(t.returncode == 1 and "nested deeper than 32 levels" in t.stderr,
              "ddprun-trace refuses a trace nested 300,000 deep with a message (not SIGSEGV)")
        t = subprocess.run([os.path.join(BIN, "ddprun-trace"), trace], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=60)
        check(t.returncode == 0 and "agent" in t.stdout, "ddprun-trace reads the merged trace")
    if failures:
        print("FAILED: %d check(s)" % len(failures))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
