#!/usr/bin/env python3
"""scaling.py: llmcl-train's scaling run on one host (docs/PERFORMANCE.md's distributed section).

Runs one GPU, then N ranks under mpiexec, each on its node-local GPU (LLMCL_DEVICE unset): ZeRO
stages 1, 2 and 3 on the 1B preset and stage 3 with --recompute on the 8B preset, at the same
per-GPU batch (one GPU runs the 8B model with the optimizer in the backward, which it needs to
fit); beside them PyTorch FSDP2 on the same models and GPUs where torch is installed
(tools/llmcl-train/yardstick.py under torchrun). Then a checkpoint saved on N ranks resumes on 2
and on 1, and one saved on 1 rank resumes on N, each going on as the run that never stopped (the
same global batch, the losses of steps 4-6 within 1e-3 in f32). Prints a table: tokens/s (the mean
of the step lines from step 4 on), the scaling efficiency (N-GPU tokens/s over N times one GPU's)
and the ratio to FSDP2. A benchmark driver: it needs GPUs for figures, but runs anywhere that
llmcl-train and mpiexec do (--preset-1b tiny --skip 8b,fsdp checks it on a CPU).

    python3 tools/bench/scaling.py -n 8
    python3 tools/bench/scaling.py -n 2 --preset-1b tiny --skip 8b,fsdp --steps 6
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

LOSS_TOL = 1e-3
# the resharding check's model: small enough to save and load in seconds on GPUs (the tiny
# preset's width where --preset-1b is tiny, for CPUs), f32 so that only the order of the gradient
# sums differs between world sizes
RESHARD_MODEL = {
    "gpu": ["--dim", "256", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ffn", "512",
            "--seq", "64"],
    "cpu": ["--dim", "64", "--layers", "2", "--heads", "2", "--kv-heads", "1", "--ffn", "96",
            "--seq", "16"],
}
RESHARD_RUN = ["--dtype", "f32", "--warmup", "2", "--min-lr", "1"]
QUIET = ["--eval-every", "0", "--sample", "0", "--log-every", "1"]


def run(cmd, timeout, env=None):
    """The finished process (env: the whole environment, default ours); a timeout counts as a
    failure with what it printed."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return subprocess.CompletedProcess(cmd, -1, out, f"timed out after {timeout} s")


def step_rates(out):
    """Tokens/s of every step line, by step (llmcl-train prints '61.2k tok/s')."""
    rates = {}
    for m in re.finditer(r"^step +(\d+)/\d+ \|.*?\| ([0-9.]+)(k?) tok/s", out, re.M):
        rates[int(m.group(1))] = float(m.group(2)) * (1000.0 if m.group(3) else 1.0)
    return rates


def step_losses(out):
    return {int(s): float(l) for s, l in re.findall(r"^step +(\d+)/\d+ \| loss ([0-9.]+)", out,
                                                     re.M)}


def mean_rate(r, first=4):
    """The mean tokens/s of steps first and later, or None (and why) for a failed run."""
    rates = [v for s, v in step_rates(r.stdout).items() if s >= first]
    if r.returncode != 0 or not rates:
        tail = (r.stdout[-400:] + r.stderr[-400:]).strip().replace("\n", " | ")
        return None, f"status {r.returncode}: {tail}"
    return sum(rates) / len(rates), ""


class Runner:
    def __init__(self, a):
        self.a = a
        self.train = os.path.join(a.build, "tools", "llmcl-train")
        self.rows = []
        self.failures = []

    def mpi(self, ranks, args):
        return [self.a.mpiexec, "-n", str(ranks), self.train] + args

    def llmcl(self, what, ranks, args, timeout):
        """One llmcl-train run: on one process without mpiexec where ranks is 0."""
        cmd = self.mpi(ranks, args) if ranks else [self.train] + args
        env = dict(os.environ)
        if ranks:  # each rank on its node-local GPU
            env.pop("LLMCL_DEVICE", None)
        r = run(cmd, timeout, env)
        rate, why = mean_rate(r)
        if rate is None:
            self.failures.append(f"{what}: {why}")
        return rate

    def fsdp(self, what, ranks, args, timeout):
        """FSDP2's tokens/s over every GPU, or None where torch or torchrun is missing."""
        if "fsdp" in self.a.skip or shutil.which(self.a.torchrun) is None:
            return None
        script = os.path.join(os.path.dirname(__file__), "..", "llmcl-train", "yardstick.py")
        r = run([self.a.torchrun, "--nproc_per_node", str(ranks), script, "--fsdp"] + args,
                timeout)
        found = re.search(r"([0-9.]+)k tokens/s", r.stdout)
        if r.returncode != 0 or not found:
            self.failures.append(f"{what}: status {r.returncode}: {r.stderr.strip()[-300:]}")
            return None
        return float(found.group(1)) * 1000.0

    def row(self, what, rate, one, n, fsdp):
        eff = rate / (n * one) if rate and one else None
        self.rows.append((what, rate, eff, rate / fsdp if rate and fsdp else None))

    def model(self, name, preset, batch, extra, one_extra, stages, fsdp_args):
        """One GPU (with one_extra where the model needs it to fit), FSDP2, then each stage."""
        a, n = self.a, self.a.ranks
        base = ["--preset", preset, "--batch", str(batch), "--steps", str(a.steps), "--warmup",
                "2", "--peak-tflops", str(a.peak_tflops)] + QUIET + extra
        one = self.llmcl(f"{name}, one GPU", 0, base + one_extra, a.timeout)
        self.rows.append((f"{name}, one GPU", one, None, None))
        fsdp = self.fsdp(f"{name}, FSDP2 on {n}", n, fsdp_args, a.timeout)
        for stage in stages:
            rate = self.llmcl(f"{name}, --zero {stage} on {n}", n, base + ["--zero", str(stage)],
                              a.timeout)
            self.row(f"{name}, --zero {stage} on {n} ranks", rate, one, n, fsdp)
        if fsdp:
            self.rows.append((f"{name}, PyTorch FSDP2 on {n} GPUs", fsdp, None, None))

    def reshard(self, tmp):
        """Saved on N, resumed on 2 and 1; saved on 1, resumed on N: steps 4-6 as without a stop."""
        n, b = self.a.ranks, 2
        size = "cpu" if self.a.preset_1b == "tiny" else "gpu"
        common = RESHARD_MODEL[size] + RESHARD_RUN + QUIET + ["--zero", "2"]
        full = run(self.mpi(n, common + ["--steps", "6", "--batch", str(b)]), self.a.timeout)
        want = step_losses(full.stdout)
        if full.returncode != 0 or len(want) != 6:
            self.failures.append(f"the run without a stop: status {full.returncode}: "
                                 f"{full.stderr.strip()[-300:]}")
            return
        cases = [(n, [2, 1]), (1, [n])]
        for saved_on, resumed_on in cases:
            ck = os.path.join(tmp, f"saved_on_{saved_on}")
            r = run(self.mpi(saved_on, common + ["--steps", "3", "--batch", str(n * b // saved_on),
                                                 "--save", ck]), self.a.timeout)
            if r.returncode != 0:
                self.failures.append(f"save on {saved_on}: status {r.returncode}: "
                                     f"{r.stderr.strip()[-300:]}")
                continue
            for ranks in resumed_on:
                got = step_losses(run(self.mpi(ranks, common + [
                    "--steps", "6", "--batch", str(n * b // ranks), "--resume", ck]),
                    self.a.timeout).stdout)
                later = {s: got[s] for s in (4, 5, 6) if s in got}
                diff = max((abs(later[s] - want[s]) for s in later if s in want),
                           default=float("inf"))
                ok = len(later) == 3 and diff <= LOSS_TOL
                print(f"{'ok  ' if ok else 'FAIL'} saved on {saved_on} rank(s), resumed on "
                      f"{ranks}: steps 4-6 within {diff:.2g} of the run without a stop")
                if not ok:
                    self.failures.append(f"saved on {saved_on}, resumed on {ranks}")

    def report(self):
        print(f"{'run':<40} {'tokens/s':>10} {'efficiency':>10} {'/ FSDP2':>8}")
        cell = lambda v, f: format(v, f) if v is not None else "-"
        for what, rate, eff, ratio in self.rows:
            print(f"{what:<40} {cell(rate, '10.0f'):>10} {cell(eff, '.3f'):>10} "
                  f"{cell(ratio, '.2f'):>8}")
        for f in self.failures:
            print(f"FAILED {f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", "--ranks", type=int, default=8, help="ranks, one a GPU")
    ap.add_argument("--build", default="build", help="the build folder (tools/llmcl-train)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch-1b", type=int, default=4)
    ap.add_argument("--batch-8b", type=int, default=2)
    ap.add_argument("--preset-1b", default="llama-1b", help="tiny checks the driver on a CPU")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--skip", default="", help="comma-separated: 1b, 8b, fsdp, reshard")
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--torchrun", default="torchrun")
    ap.add_argument("--timeout", type=int, default=600, help="seconds a run may take")
    a = ap.parse_args()
    a.skip = set(s for s in a.skip.split(",") if s)
    if a.ranks < 2:
        sys.exit("scaling.py: -n must be 2 or more")
    r = Runner(a)
    if "1b" not in a.skip:
        r.model("1B", a.preset_1b, a.batch_1b, [], [], (1, 2, 3),
                ["--batch", str(a.batch_1b), "--steps", str(a.steps)])
    if "8b" not in a.skip:
        # one GPU holds the 8B model's state only with the optimizer in the backward, which
        # leaves out clipping (docs/PERFORMANCE.md)
        r.model("8B", "llama-8b", a.batch_8b, ["--recompute"],
                ["--optimizer-in-backward", "--clip", "0"], (3,),
                ["--preset", "llama-8b", "--recompute", "--batch", str(a.batch_8b), "--seq",
                 "8192", "--steps", "4", "--warmup", "1"])
    if "reshard" not in a.skip:
        tmp = tempfile.mkdtemp(prefix="llmcl_scaling_")
        try:
            r.reshard(tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    r.report()
    sys.exit(1 if r.failures else 0)


if __name__ == "__main__":
    main()
