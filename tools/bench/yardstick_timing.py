"""The yardstick scripts' timer: the median of a CUDA callable's runs in ms, by
triton.testing.do_bench where Triton is present, else by CUDA events after three warm-up runs."""
import torch

try:
    from triton.testing import do_bench
except ImportError:
    do_bench = None


def median_ms(fn, runs=20):
    if do_bench:
        return do_bench(fn, warmup=max(runs // 4, 5), rep=10 * runs, return_mode="median")
    times = []
    for _ in range(runs + 3):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return sorted(times[3:])[len(times[3:]) // 2]
