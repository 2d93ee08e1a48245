#!/usr/bin/env python3
"""test_tool_options.py: llmcl-bench's, llmcl-tune's and llmcl-info's command lines. Unknown
options, options without their value, values out of range or not numbers (llmcl-bench's --reps
and --settle, llmcl-tune's --max-time, --max-candidates, --reps and --warmup) and unknown families
fail with one line on stderr that names them and status 2, before the device is touched; --help
prints the usage. A run of one llmcl-bench family at small sizes checks its rows against the CPU
reference, with --reps and with --settle's host-timed batches.

    python3 tests/test_tool_options.py build/tools/llmcl-bench build/tools/llmcl-tune \
        build/tools/llmcl-info
"""
import subprocess
import sys

BENCH, TUNE, INFO = sys.argv[1], sys.argv[2], sys.argv[3]


def run(*args, exe=BENCH):
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=600)


def bad(args, expect, exe=BENCH):
    r = run(*args, exe=exe)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (exe, args, r.returncode, r.stderr)
    assert len(lines) == 1 and expect in lines[0], (exe, args, r.stderr)
    assert r.stdout == "", (exe, args, "the device was touched before the check", r.stdout)


def tune_options():
    for v in ["abc", "-1", "0", "inf", "1e9"]:
        bad(["--max-time", v], f"--max-time {v}: expected seconds, 0.001 to a week", TUNE)
    for opt, lo, hi, vals in (("--max-candidates", 0, 1000000, ["-3", "5x", "1000001"]),
                              ("--reps", 1, 64, ["0", "65", ""]),
                              ("--warmup", 0, 1000, ["x", "-1", "1001"])):
        for v in vals:
            bad(["--quick", opt, v], f"{opt} {v}: expected a whole number from {lo} to {hi}", TUNE)
    bad(["--kernel", "nope"], "no kernel or family named nope", TUNE)
    bad(["--kernel"] * 33 * 2, "at most 32 --kernel options", TUNE)
    r = run("--help", exe=TUNE)
    assert r.returncode == 0 and "usage: llmcl-tune" in r.stdout


def main():
    tune_options()
    bad(["--bogus"], "llmcl-info: unknown option --bogus", INFO)
    bad(["--bogus"], "unknown option --bogus")
    bad(["--only"], "--only needs a value")
    bad(["--only", "nope"], "--only nope: no such family; the families: elementwise")
    for reps in ["0", "-5", "65", "7x", ""]:
        bad(["--reps", reps], f"--reps {reps}: expected a whole number of runs from 1 to 64")
    for s in ["-1", "61", "abc", "nan"]:
        bad(["--settle", s], f"--settle {s}: expected seconds from 0 to 60")
    bad(["--small", "--settle"], "--settle needs a value")

    r = run("--help")
    assert r.returncode == 0 and "usage: llmcl-bench" in r.stdout and "elementwise" in r.stdout

    for args in (["--reps", "2"], ["--settle", "0.02"]):
        r = run("--only", "elementwise", "--small", *args)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        rows = [l for l in r.stdout.splitlines() if l.startswith(("copy", "cast", "axpy", "fill"))]
        assert len(rows) == 7 and all(l.split()[-1] == "ok" for l in rows), (args, r.stdout)
        timing = "median of 2 runs" if args[0] == "--reps" else "batches"
        assert timing in r.stdout, (args, r.stdout)
    print("test_tool_options: all passed")


if __name__ == "__main__":
    main()
