#!/usr/bin/env python3
"""test_train_cli.py: llmcl-train as a user runs it. Bad configurations, missing and malformed
files and bad options fail with a clear message and status 1 (2 for unknown options); llm.c token
files train; a run resumed from a checkpoint ends with the same bits as an uninterrupted one;
Ctrl-C with --save-on-interrupt writes a checkpoint and exits 130.

    python3 tests/test_train_cli.py build/tools/llmcl-train
"""
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile

TRAIN = sys.argv[1]
TINY = ["--dim", "64", "--heads", "2", "--kv-heads", "1", "--ffn", "96", "--layers", "1",
        "--batch", "2", "--seq", "16", "--eval-every", "0", "--sample", "0", "--log-every", "1"]
failures = []


def run(args, timeout=300):
    return subprocess.run([TRAIN] + args, capture_output=True, text=True, timeout=timeout)


def expect_error(what, args, needle, code=1):
    r = run(args)
    ok = r.returncode == code and needle in r.stderr
    print(f"{'ok  ' if ok else 'FAIL'} {what}: status {r.returncode}, {r.stderr.strip()[:160]}")
    if not ok:
        failures.append(what)


def expect_ok(what, args):
    r = run(args)
    ok = r.returncode == 0
    print(f"{'ok  ' if ok else 'FAIL'} {what}: status {r.returncode}")
    if not ok:
        print(r.stdout[-2000:], r.stderr[-2000:])
        failures.append(what)
    return r


def llmc_file(path, tokens, magic=20240520, version=1, count=None, width="H"):
    header = [0] * 256
    header[0], header[1], header[2] = magic, version, len(tokens) if count is None else count
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(tokens)}{width}", *tokens))


def main():
    tmp = tempfile.mkdtemp(prefix="llmcl-train-cli.")
    p = lambda name: os.path.join(tmp, name)
    expect_error("heads that do not divide the width", TINY + ["--heads", "3"],
                 "3 heads do not divide the width 64")
    expect_error("kv heads that do not divide the heads", TINY + ["--kv-heads", "3"],
                 "3 key/value heads do not divide the 2 query heads")
    expect_error("head dimension out of range", TINY + ["--heads", "4", "--kv-heads", "2"],
                 "head dimension 16")
    expect_error("missing data file", TINY + ["--data", p("missing.txt")], "cannot open")
    with open(p("short.txt"), "w") as f:
        f.write("too short for a batch")
    expect_error("a sequence longer than the data", TINY + ["--data", p("short.txt")],
                 "needs at least")
    llmc_file(p("truncated.bin"), list(range(100)), count=200)
    expect_error("a truncated llm.c token file", TINY + ["--data", p("truncated.bin")],
                 "truncated or corrupt")
    llmc_file(p("big.bin"), [(7 * i) % 300 for i in range(2000)])
    expect_error("tokens beyond the vocabulary", TINY + ["--data", p("big.bin"), "--vocab", "256"],
                 "outside the model's vocabulary")
    expect_ok("an llm.c uint16 token file", TINY + ["--data", p("big.bin"), "--vocab", "300",
                                                     "--steps", "2"])
    llmc_file(p("llama3.bin"), [(11 * i) % 500 for i in range(2000)], magic=20240801, version=7,
              width="I")
    expect_ok("an llm.c uint32 token file", TINY + ["--data", p("llama3.bin"), "--vocab", "512",
                                                     "--steps", "2"])
    expect_error("a bad option value", TINY + ["--lr", "fast"], "expected a number")
    expect_error("an unknown option", TINY + ["--frobnicate"], "", code=2)
    expect_error("offload without recompute", TINY + ["--offload"], "give both")

    # resuming: 3 + 3 steps end with the bits of 6 uninterrupted ones (the file's whole bytes)
    expect_ok("6 steps", TINY + ["--steps", "6", "--save", p("straight.st")])
    expect_ok("3 steps", TINY + ["--steps", "6", "--save", p("half.st"), "--save-every", "3"])
    r = expect_ok("resume for 3 more", TINY + ["--steps", "6", "--resume", p("half.st"),
                                                "--save", p("resumed.st")])
    same = open(p("straight.st"), "rb").read() == open(p("resumed.st"), "rb").read()
    print(f"{'ok  ' if same else 'FAIL'} resumed checkpoint identical to the uninterrupted one")
    if not same or "resumed from" not in r.stdout:
        failures.append("resume")
    expect_error("a checkpoint of another shape", TINY + ["--ffn", "128", "--resume",
                                                          p("straight.st")], "another shape")
    with open(p("straight.st"), "rb") as f:
        data = f.read()
    with open(p("cut.st"), "wb") as f:
        f.write(data[: len(data) // 2])
    expect_error("a truncated checkpoint", TINY + ["--resume", p("cut.st")], "cannot resume")

    # Ctrl-C with --save-on-interrupt
    proc = subprocess.Popen([TRAIN] + TINY + ["--steps", "1000000", "--save", p("int.st"),
                                              "--save-on-interrupt"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while True:
        line = proc.stdout.readline()
        if not line or line.startswith("step"):
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    ok = proc.returncode == 130 and os.path.exists(p("int.st")) and "interrupted" in out
    print(f"{'ok  ' if ok else 'FAIL'} Ctrl-C saves and exits 130: status {proc.returncode}")
    if not ok:
        print(out[-1000:], err[-1000:])
        failures.append("interrupt")

    shutil.rmtree(tmp)
    if failures:
        print("failed:", ", ".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
