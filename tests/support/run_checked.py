#!/usr/bin/env python3
"""Runs one command for ctest and fails unless it did everything it should.

    run_checked.py [--exit CODE] [--expect REGEX]... [--forbid REGEX]... -- COMMAND [ARGS...]

The command passes only when it exits with CODE (default 0; a signal death counts as 128 + the
signal, as a shell reports it), every --expect pattern occurs in its output (stdout and stderr
together) and no --forbid pattern does. ctest's PASS_REGULAR_EXPRESSION ignores the exit code
and accepts any one of its patterns; a multi-process test registered through this driver fails
when any process of the job exits non-zero (ddprun exits with the failing worker's code) or when
one rank's success line is missing.

The command's output is passed through as it comes, so ctest's log shows it in full.
"""
import argparse
import re
import subprocess
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exit", type=int, default=0, help="the exit code that passes")
    parser.add_argument("--expect", action="append", default=[], help="regex that must occur")
    parser.add_argument("--forbid", action="append", default=[], help="regex that must not occur")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no COMMAND after --")

    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    chunks = []
    for chunk in iter(lambda: proc.stdout.read1(65536), b""):
        chunks.append(chunk)
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
    rc = proc.wait()
    code = rc if rc >= 0 else 128 - rc
    output = b"".join(chunks).decode("utf-8", "replace")

    failures = []
    if code != args.exit:
        failures.append("exit code %d, expected %d" % (code, args.exit))
    for pattern in args.expect:
        if not re.search(pattern, output, re.MULTILINE):
            failures.append("missing from the output: /%s/" % pattern)
    for pattern in args.forbid:
        match = re.search(pattern, output, re.MULTILINE)
        if match:
            failures.append("forbidden in the output: /%s/ matched %r" % (pattern, match.group(0)))
    print("---- run_checked: %s" % " ".join(command))
    if failures:
        for f in failures:
            print("FAILED: " + f)
        return 1
    print("PASSED: exit code %d, %d expected pattern(s) found, %d forbidden absent"
          % (code, len(args.expect), len(args.forbid)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
