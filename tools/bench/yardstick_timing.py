"""The yardstick scripts' timer: the median of a CUDA callable's runs in ms, by
triton.testing.do_bench where Triton is present, else by CUDA events after three warm-up runs.
With a settling time (add_settle_argument, as llmcl-bench's --settle), each callable first runs
for that long, in batches that keep the GPU busy, so that its clock has settled under its power
cap; then the median of its runs back to back, each between two CUDA events, with no wait and no
cache flush between them (do_bench's flushes idle the GPU between runs, and its clock rises).
With graph=True, the runs settle and are timed as replays of one CUDA graph of `runs` calls,
each replay's time over its calls: Python launches a call in tens of microseconds, longer than
a short product runs, and the GPU would wait on the host between calls."""
import time

import torch

try:
    from triton.testing import do_bench
except ImportError:
    do_bench = None

SETTLE_S = 0.0
# a settling batch lasts about this long: its runs go back to back, with one wait at its end
SETTLE_BATCH_S = 0.02
SETTLE_MAX_BATCH = 1024


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
    """Runs fn once (its libraries' plans made), once more to see how long a run takes, then in
    batches of SETTLE_BATCH_S until SETTLE_S have passed, as llmcl-bench's settle does."""
    run_to_end(fn)
    start = time.monotonic()
    run_to_end(fn)
    run_s = time.monotonic() - start
    batch = max(1, min(SETTLE_MAX_BATCH, int(SETTLE_BATCH_S / max(run_s, 1e-9))))
    while time.monotonic() - start < SETTLE_S:
        for _ in range(batch):
            fn()
        torch.cuda.synchronize()


def events_ms(fn, runs, back_to_back):
    """The median of runs calls of fn, each between two CUDA events; back to back without a wait
    between them, or each run to its end."""
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
             for _ in range(runs)]
    for s, e in pairs:
        s.record()
        fn()
        e.record()
        if not back_to_back:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in pairs)
    return times[len(times) // 2]


def graph_of(fn, calls):
    """A CUDA graph of calls runs of fn, returned as its replay; its first run warms fn up on a
    side stream, as capture requires."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph.replay


def median_ms(fn, warmup=25, rep=200, runs=20, graph=False):
    """do_bench's warmup and rep are in ms; the CUDA-event forms time runs calls."""
    if SETTLE_S > 0:
        if graph:
            replay = graph_of(fn, runs)
            settle(replay)
            return events_ms(replay, 5, back_to_back=True) / runs
        settle(fn)
        return events_ms(fn, runs, back_to_back=True)
    if do_bench:
        return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
    for _ in range(3):
        fn()
    return events_ms(fn, runs, back_to_back=False)
