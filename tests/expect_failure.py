#!/usr/bin/env python3
"""expect_failure.py: runs a command that must fail in a given way, for tests whose pass is a
failure (dist_abort: a rank that fails inside a step must end the whole job). Passes only when the
command exits non-zero AND its output (stdout and stderr) holds the expected message, so that a
failure of another kind (a setup that broke, a missing device, a crash) is not taken for the one
under test. Exit 77 (no usable device) passes through as a skip.

usage: expect_failure.py [--reject TEXT]... MESSAGE COMMAND [ARG]...
"""
import subprocess
import sys


def main(argv):
    rejects = []
    while len(argv) > 1 and argv[0] == "--reject":
        rejects.append(argv[1])
        argv = argv[2:]
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    message, command = argv[0], argv[1:]
    run = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         errors="replace")
    sys.stdout.write(run.stdout)
    if run.returncode == 77 and message not in run.stdout:
        print("expect_failure: skipped (exit 77)")
        return 77
    if run.returncode == 0:
        print("expect_failure: FAIL: the command succeeded; expected a failure saying: " + message)
        return 1
    if message not in run.stdout:
        print("expect_failure: FAIL: the command failed (exit %d) without saying: %s"
              % (run.returncode, message))
        return 1
    for text in rejects:
        if text in run.stdout:
            print("expect_failure: FAIL: the output says: " + text)
            return 1
    print("expect_failure: the command failed as expected (exit %d)" % run.returncode)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
