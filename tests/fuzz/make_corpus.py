#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/): one realistic input
per frame kind and state shape, so that libFuzzer starts from valid traffic. Re-run after a
protocol change: python3 tests/fuzz/make_corpus.py"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CUR = dict(VALIDATE=0, SET=1, COMPARE_SET=2, GET=3, ADD=4, CHECK=5, WAIT=6, GETNUMKEYS=7,
           DELETE_KEY=8, APPEND=9, MULTI_GET=10, MULTI_SET=11, CANCEL_WAIT=12, PING=13,
           QUEUE_PUSH=14, QUEUE_POP=15, QUEUE_LEN=16)
LEG = dict(SET=0, COMPARE_SET=1, GET=2, ADD=3, CHECK=4, WAIT=5, GETNUMKEYS=6, WATCH_KEY=7,
           DELETE_KEY=8)
EXT = dict(HELLO=0x60, AUTH=0x61, WAIT_GET=0x62, HELLO2=0x63)


def s(b):
    b = b if isinstance(b, bytes) else b.encode()
    return struct.pack("<Q", len(b)) + b


def u32(v):
    return struct.pack("<I", v)


def i64(v):
    return struct.pack("<q", v)


def u64(v):
    return struct.pack("<Q", v)


def frames(cmd):
    """One frame per operation of a dialect (cmd: name -> byte)."""
    c = lambda name: bytes([cmd[name]])
    out = {}
    if "VALIDATE" in cmd:
        out["validate_ping"] = c("VALIDATE") + u32(0x3C85F7CE) + c("PING") + u32(4242)
    out["set"] = c("SET") + s("key") + s(b"value\x00bytes")
    out["compare_set"] = c("COMPARE_SET") + s("key") + s("") + s("new")
    out["get"] = c("GET") + s("key")
    out["add"] = c("ADD") + s("counter") + i64(-3)
    out["check"] = c("CHECK") + u64(2) + s("a") + s("b")
    out["wait"] = c("WAIT") + u64(3) + s("a") + s("b") + s("a")
    out["getnumkeys"] = c("GETNUMKEYS")
    out["delete"] = c("DELETE_KEY") + s("key")
    for name, body in (("APPEND", s("k") + s("tail")), ("MULTI_GET", u64(2) + s("a") + s("b")),
                       ("MULTI_SET", u64(2) + s("a") + s("1") + s("b") + s("2")),
                       ("CANCEL_WAIT", b""), ("QUEUE_PUSH", s("q") + s("item")),
                       ("QUEUE_POP", s("q")), ("QUEUE_LEN", s("q")), ("WATCH_KEY", s("k"))):
        if name in cmd:
            out[name.lower()] = c(name) + body
    out["hello"] = bytes([EXT["HELLO"]])
    out["hello2"] = bytes([EXT["HELLO2"]]) + u32(2) + s(b"\x01" * 32)
    out["auth"] = bytes([EXT["AUTH"]]) + s(b"\x02" * 32)
    out["wait_get"] = bytes([EXT["WAIT_GET"]]) + s("key")
    out["state_key"] = c("SET") + s("ddprun/rdzv/job/state/1") + s("ddprun-rendezvous-state 1\n")
    return out


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    for dialect, cmd, tag in ((0, CUR, "current"), (1, LEG, "legacy")):
        fr = frames(cmd)
        for name, data in fr.items():
            write("frame_parser", "%s_%s" % (tag, name), bytes([dialect]) + data)
        write("frame_parser", "%s_all" % tag, bytes([dialect]) + b"".join(fr.values()))
    states = {
        "joining": "ddprun-rendezvous-state 1\nround 1\nphase joining\nrestarts 0\nexit 0\n"
                   "reason node a arrived\nmember a 127.0.0.2 2 41873 -1 -1\n"
                   "expected b 0\nexpected c 1\n",
        "closed": "ddprun-rendezvous-state 1\nround 3\nphase closed\nrestarts 1\nexit 0\n"
                  "finishing 1\nreason x\nmember a 127.0.0.2 2 41873 -1 -1\n"
                  "member b ::1 4 41874 1 -1\nwaiting c host.example 1 41875 -1 -1\n",
        "failed": "ddprun-rendezvous-state 1\nround 2\nphase failed\nrestarts 3\nexit 7\n"
                  "reason workers of node a failed\nmember a 127.0.0.2 1 41873 0 -1\n",
        "finished": "ddprun-rendezvous-state 1\nround 0\nphase finished\nrestarts 0\nexit 0\n"
                    "reason done\nmember a 10.0.0.1 8 29500 -1 -1\n",
        # Compact states (spilled lists, rendezvous/state_log.h).
        "compact_closed": "ddprun-rendezvous-state 1\nround 2\nphase closed\nrestarts 0\nexit 0\n"
                          "reason first round\nmembers-list 3 256 731 127.0.0.2 41873\ndone a\n",
        "compact_joining_restart": "ddprun-rendezvous-state 1\nround 3\nphase joining\nrestarts 1\n"
                                   "exit 0\nreason workers of node a failed: boom (restart 1 of 2)\n"
                                   "expected-list 4 256 members\nwaiting-list 5 2\n",
    }
    for name, text in states.items():
        write("state_codec", name, text.encode())
    # store_session: byte 0 = token bit | (piece size - 1) << 1, then one connection's stream.
    def session(token, piece):
        return bytes([(1 if token else 0) | ((piece - 1) << 1)])
    validate = bytes([CUR["VALIDATE"]]) + u32(0x3C85F7CE)
    cur = frames(CUR)
    sessions = {
        "current_all": session(False, 7) + validate + b"".join(
            v for k, v in cur.items() if k not in ("validate_ping", "hello2")),
        "legacy_all": session(False, 64) + b"".join(
            v for k, v in frames(LEG).items() if k != "hello2"),
        "wait_then_set": session(False, 3) + validate + bytes([CUR["WAIT"]]) + u64(2) + s("a") +
                         s("b") + bytes([CUR["SET"]]) + s("a") + s("1") +
                         bytes([CUR["MULTI_SET"]]) + u64(1) + s("b") + s("2") +
                         bytes([CUR["GET"]]) + s("a"),
        "no_read_flood": session(False, 128) + validate + bytes([CUR["SET"]]) + s("big") +
                         s(b"v" * 3000) + (bytes([CUR["GET"]]) + s("big")) * 20,
        "caps": session(False, 128) + validate + b"".join(
            bytes([CUR["SET"]]) + s("k%d" % i) + s(b"x" * 600) for i in range(40)),
        "token_handshake": session(True, 5) + validate + bytes([CUR["PING"]]) + u32(7) +
                           bytes([EXT["HELLO"]]) + bytes([EXT["AUTH"]]) + s(b"\x02" * 32),
        "token_set_first": session(True, 1) + validate + bytes([CUR["SET"]]) + s("k") +
                           u64(1 << 30),
        "queues": session(False, 2) + validate + bytes([CUR["WAIT"]]) + u64(1) + s("q") +
                  bytes([CUR["QUEUE_PUSH"]]) + s("q") + s("one") + bytes([CUR["QUEUE_POP"]]) +
                  s("q") + bytes([CUR["QUEUE_LEN"]]) + s("q") + bytes([CUR["CANCEL_WAIT"]]),
    }
    for name, data in sessions.items():
        write("store_session", name, data)


if __name__ == "__main__":
    main()
