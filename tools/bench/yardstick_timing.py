"""The yardstick scripts' timer: the median of a CUDA callable's runs in ms, by
triton.testing.do_bench where Triton is present, else by CUDA events after three warm-up runs.
With a settling time (add_settle_argument, as llmcl-bench's --settle), each callable first runs
for that long, so that the GPU's clock has settled under its power cap."""
import time

import torch

try:
    from triton.testing import do_bench
except ImportError:
    do_bench = None

SETTLE_S = 0.0


def add_settle_argument(parser):
    """--settle S on an argparse parser; apply_settle(args) then sets SETTLE_S."""
    parser.add_argument("--settle", type=float, default=0.0, metavar="S",
                        help="run each callable for S seconds before timing it (0 to 60)")


def apply_settle(args):
    global SETTLE_S
    if not 0 <= args.settle <= 60:
        raise SystemExit(f"--settle {args.settle}: expected seconds from 0 to 60")
    SETTLE_S = args.settle


def run_to_end(fn):
    fn()
    torch.cuda.synchronize()


def settle(fn):
    """With SETTLE_S: runs fn once (its libraries' plans made), then again until SETTLE_S have
    passed, each run to its end, as llmcl-bench's settle does."""
    if SETTLE_S <= 0:
        return
    run_to_end(fn)
    start = time.monotonic()
    while time.monotonic() - start < SETTLE_S:
        run_to_end(fn)


def median_ms(fn, warmup=25, rep=200, runs=20):
    """do_bench's warmup and rep are in ms; the CUDA-event fallback times runs calls."""
    settle(fn)
    if do_bench:
        return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
    times = []
    for _ in range(runs + 3):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return sorted(times[3:])[len(times[3:]) // 2]
