#!/usr/bin/env python3
"""Fails when a Catch2 TEST_CASE name under tests/ holds a ';'.

catch_discover_tests registers each test case as a ctest test named after it, and CMake splits
a name at ';' (its list separator): the ctest entry then names a test case that does not exist,
and (with --warn NoTests) fails on every run, for a reason unrelated to the test. Catching it
here names the file and the test case at once.
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
literal = re.compile(r'"((?:[^"\\]|\\.)*)"')
case = re.compile(r'TEST_CASE\(((?:\s*"(?:[^"\\]|\\.)*")+)')
bad = []
for path in sorted(root.rglob("*.cpp")):
    text = path.read_text(errors="replace")
    for m in case.finditer(text):
        name = "".join(literal.findall(m.group(1)))
        if ";" in name:
            line = text.count("\n", 0, m.start()) + 1
            bad.append(f"{path}:{line}: TEST_CASE name holds ';' (ctest splits it there): {name[:100]}")
for b in bad:
    print(b)
print(f"{len(bad)} test case name(s) with ';'" if bad else "no test case name holds ';'")
sys.exit(1 if bad else 0)
