"""The yardstick scripts' timer: the median of a CUDA callable's runs in ms, by
triton.testing.do_bench where Triton is present, else by CUDA events after three warm-up runs."""
import torch

try:
    from triton.testing import do_bench
except ImportError:
    do_bench = None


def median_ms(fn, warmup=25, rep=200, runs=20):
    """do_bench's warmup and rep are in ms; the CUDA-event fallback times runs calls."""
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
