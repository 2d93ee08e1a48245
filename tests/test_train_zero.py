#!/usr/bin/env python3
"""test_train_zero.py: llmcl-train --zero under mpiexec (suite mpi). A job of N ranks at --batch b
reads the rows that one process reads at --batch N b, in the same order, so its per-step losses
(the mean over the ranks) must match that single run's: ZeRO stages 1, 2 and 3 on 2 ranks and
stage 3 on 3, f32 compute, within LOSS_TOL (only the order of the gradient sums differs); stage 3
with --recompute=ops and =2 (the second of 2 layers recomputed whole) the losses without it;
--zero-group-layers 2 the losses of one layer a group, and without clipping (whose global norm
sums each rank's shards, which the groups decide) the same master weights bit for bit;
--zero-group-layers auto two layers a group where the embedding's group holds two, one where a
layer outsizes it, and the losses of that count; --zero-reduce-dtype bf16 at stages 1 and 3 the
losses within 2e-3, and its bad values refused. A
checkpoint saved on 2 ranks at step 3 resumes on 1 rank and on 3 and continues as the
uninterrupted run; a checkpoint of another shape, and a one-file checkpoint given to --zero (or a
folder without it), are refused with a clear message on every rank and status 1, mpiexec killing
none, under a timeout. A job killed at each stage of a save (LLMCL_TEST_SAVE_STOP) leaves a whole
checkpoint, the previous one or the new one, that a resume finds and continues, and whose next
save leaves the folder alone behind it. --profile on 2 ranks profiles on both or neither, and
ends, and says how much of the step's wall its llmcl_dist calls took. --init-from, --export and
--dump-logits under stages 1-3: a model through the shards and back, the same files and logits as
one process; trained from it on 3 ranks, the losses and (within 1e-5) the export of one process;
a missing tensor refused on every rank. LoRA at stages 1-3 on 2 ranks (the adapters in the dist,
the base on every rank): the losses and exports (adapters, merged) of one process, a checkpoint
resumed at another stage and refused on another base, --init-adapter's logits; bf16 adapters
refused. Packed examples (rows of different counts of learning targets) on 2 and 3 ranks: the
losses of one process. --teacher at stages 1-3 on 2 ranks and stage 3 on 3: the losses of one
process. --preference (the reference model whole on every rank): DPO at stages 1 and 3 on 2 ranks,
LoRA's DPO against its own base at stage 3 on 2, and ORPO, whose supervised term weighs each
rank's share of the chosen tokens, at stage 3 on 3: the losses of one process.

    python3 tests/test_train_zero.py build/tools/llmcl-train mpiexec
"""
import array
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

TRAIN, MPIEXEC = sys.argv[1], sys.argv[2]
LOSS_TOL = 1e-3  # the printed losses (4 decimals) of f32 runs
# a constant learning rate after the warmup (--min-lr 1), so that a run of 3 steps is the first
# half of a run of 6
TINY = ["--dim", "64", "--heads", "2", "--kv-heads", "1", "--ffn", "96", "--layers", "2",
        "--seq", "16", "--dtype", "f32", "--warmup", "2", "--min-lr", "1", "--eval-every", "0",
        "--sample", "0", "--log-every", "1"]
failures = []


# Where a save may be killed (include/llmcl_dist.h), and the step of the checkpoint a resume must
# find then: the previous (3) until the new folder has its name, the new one (6) after.
SAVE_STAGES = {"created": 3, "shards": 3, "manifest": 3, "files": 3, "aside": 3, "renamed": 6}


def run(ranks, args, env=None):
    cmd = [TRAIN] + TINY + args
    if ranks:
        cmd = [MPIEXEC, "-n", str(ranks)] + cmd
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, **(env or {})))
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, -1, "", "timed out (a hang)")


def check(what, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}")
    if not ok:
        failures.append(what)


def step_losses(out):
    return {int(s): float(l) for s, l in re.findall(r"^step +(\d+)/\d+ \| loss ([0-9.]+)", out,
                                                     re.M)}


def losses(what, ranks, args, r=None):
    """The printed losses by step of a run (r: one already made)."""
    r = r or run(ranks, args)
    found = step_losses(r.stdout)
    if r.returncode != 0 or not found:
        check(what, False, f"status {r.returncode}\n{r.stdout[-1500:]}{r.stderr[-1500:]}")
        return {}
    return found


def compare(what, got, want, tol=LOSS_TOL):
    diff = max((abs(got[s] - want[s]) for s in want if s in got), default=float("inf"))
    ok = bool(got) and set(got) == set(want) and diff <= tol
    check(what, ok, f"max |loss difference| {diff:.2g} over steps {sorted(got)}")


def expect_refusal(what, ranks, args, needle):
    """Every rank refuses with the message and status 1: the ranks agree on the refusal and each
    leaves MPI before it exits, so that mpiexec kills none of them (the first rank's exit made it
    kill the others while they still ran, 'Killed (signal 9)', in some runs)."""
    r = run(ranks, args)
    lines = [l for l in r.stderr.splitlines() if needle in l]
    killed = "BAD TERMINATION" in r.stdout + r.stderr or "signal" in r.stdout + r.stderr
    ok = r.returncode == 1 and len(lines) == max(ranks, 1) and not killed
    check(what, ok, f"status {r.returncode}, {len(lines)} of {max(ranks, 1)} rank(s) said: "
                    f"{lines[0][:150] if lines else r.stderr.strip()[-300:]}"
                    f"{' (mpiexec killed some)' if killed else ''}")


def master_bits(ck):
    """The bits of a checkpoint's f32 master weights, sorted: the shards lay them out by group."""
    words = array.array("I")
    for name in sorted(os.listdir(ck)):
        if not name.startswith("shard-"):
            continue
        with open(os.path.join(ck, name), "rb") as f:
            data = f.read()
        n = struct.unpack("<Q", data[:8])[0]
        begin, end = json.loads(data[8:8 + n])["master"]["data_offsets"]
        words.frombytes(data[8 + n + begin:8 + n + end])
    return sorted(words)


def read_st(path):
    """A safetensors file as (header, body)."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def largest_difference(a, b):
    """The largest |difference| between two f32 safetensors files' tensors (inf where they do not
    hold the same names and shapes)."""
    (ha, da), (hb, db) = read_st(a), read_st(b)
    ha.pop("__metadata__", None), hb.pop("__metadata__", None)
    if {k: v["shape"] for k, v in ha.items()} != {k: v["shape"] for k, v in hb.items()}:
        return float("inf")
    worst = 0.0
    for name, v in ha.items():
        x, y = array.array("f"), array.array("f")
        x.frombytes(da[v["data_offsets"][0]:v["data_offsets"][1]])
        y.frombytes(db[hb[name]["data_offsets"][0]:hb[name]["data_offsets"][1]])
        worst = max([worst] + [abs(p - q) for p, q in zip(x, y)])
    return worst


def hugging_face(tmp):
    """--init-from, --export and --dump-logits under --zero: the weights through the shards and
    back bit for bit at every stage, training from them as one process does, and a bad file
    refused on every rank."""
    base = tmp + "/hf"
    r = run(0, ["--steps", "3", "--batch", "4", "--export", base, "--export-dtype", "f32"])
    check("one process exports an f32 model", r.returncode == 0, r.stderr[-300:])
    r = run(0, ["--steps", "0", "--batch", "2", "--init-from", base, "--dump-logits",
                tmp + "/hf_one.st"])
    check("one process dumps its logits", r.returncode == 0, r.stderr[-300:])
    for stage in (1, 2, 3):
        out = f"{tmp}/hf_z{stage}"
        r = run(2, ["--steps", "0", "--batch", "2", "--zero", str(stage), "--init-from", base,
                    "--export", out, "--export-dtype", "f32", "--dump-logits", out + ".st"])
        same = r.returncode == 0 and all(
            open(f"{base}/{n}", "rb").read() == open(f"{out}/{n}", "rb").read()
            for n in ("model.safetensors", "config.json"))
        check(f"stage {stage} on 2 ranks: --init-from, then --export, the same files", same,
              f"status {r.returncode}{r.stderr[-300:]}")
        check(f"stage {stage} on 2 ranks: --dump-logits, the logits of one process",
              r.returncode == 0 and open(out + ".st", "rb").read() ==
              open(tmp + "/hf_one.st", "rb").read())
    r = run(2, ["--steps", "0", "--batch", "2", "--zero", "3", "--init-from", base, "--export",
                tmp + "/hf_shards", "--export-dtype", "f32", "--export-shard-gb", "0.00005"])
    r1 = run(0, ["--steps", "0", "--batch", "2", "--init-from", tmp + "/hf_shards", "--export",
                 tmp + "/hf_joined", "--export-dtype", "f32"])
    check("stage 3 on 2 ranks: a sharded export, read back as the one file",
          r.returncode == 0 and r1.returncode == 0 and
          os.path.exists(tmp + "/hf_shards/model.safetensors.index.json") and
          open(base + "/model.safetensors", "rb").read() ==
          open(tmp + "/hf_joined/model.safetensors", "rb").read(),
          f"status {r.returncode}, {r1.returncode}{r.stderr[-300:]}{r1.stderr[-300:]}")
    one = losses("one process from the export, batch 6", 0,
                 ["--steps", "3", "--batch", "6", "--init-from", base, "--export", tmp + "/hf_t1",
                  "--export-dtype", "f32"])
    three = losses("stage 3 on 3 ranks from the export", 3,
                   ["--steps", "3", "--batch", "2", "--zero", "3", "--init-from", base,
                    "--export", tmp + "/hf_t3", "--export-dtype", "f32"])
    compare("3 ranks x batch 2, stage 3, from the export, against one process at batch 6",
            three, one)
    if one and three:
        diff = largest_difference(tmp + "/hf_t1/model.safetensors",
                                  tmp + "/hf_t3/model.safetensors")
        check("their exports after 3 steps", diff <= 1e-5, f"largest difference {diff:.2g}")
    header, body = read_st(base + "/model.safetensors")
    os.mkdir(tmp + "/hf_missing")
    shutil.copy(base + "/config.json", tmp + "/hf_missing/config.json")
    header.pop("model.layers.1.mlp.up_proj.weight")
    header.pop("__metadata__", None)
    blobs = []
    for v in sorted(header.values(), key=lambda v: v["data_offsets"][0]):
        begin, end = v["data_offsets"]
        v["data_offsets"] = [sum(map(len, blobs)), sum(map(len, blobs)) + end - begin]
        blobs.append(body[begin:end])
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(tmp + "/hf_missing/model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    expect_refusal("a missing tensor under --zero, on 2 ranks", 2,
                   ["--steps", "1", "--batch", "2", "--zero", "3", "--init-from",
                    tmp + "/hf_missing"], "missing tensor model.layers.1.mlp.up_proj.weight")


def lora(tmp):
    """LoRA under --zero on hugging_face()'s base: the adapters in the dist, the base replicated.
    The losses and exports (adapters, merged) of one process at every stage; a checkpoint that
    resumes at another stage, and only on its own base; --init-adapter's logits."""
    base = tmp + "/hf"
    lo = ["--init-from", base, "--lora", "4", "--lora-targets", "q,v,down"]
    one = losses("LoRA, one process at batch 4", 0,
                 lo + ["--steps", "4", "--batch", "4", "--export", tmp + "/lo1", "--export-dtype",
                       "f32"])
    merged = run(0, lo + ["--steps", "4", "--batch", "4", "--export", tmp + "/lo1m",
                          "--export-dtype", "f32", "--lora-merge"])
    check("LoRA, one process, merged export", merged.returncode == 0, merged.stderr[-300:])
    for stage in (1, 2, 3):
        out = f"{tmp}/lo{stage}"
        r = run(2, lo + ["--steps", "4", "--batch", "2", "--zero", str(stage), "--export", out,
                         "--export-dtype", "f32"])
        compare(f"LoRA on 2 ranks, stage {stage}, against one process",
                losses(f"LoRA, stage {stage}", 2, [], r), one)
        diff = largest_difference(tmp + "/lo1/adapter_model.safetensors",
                                  out + "/adapter_model.safetensors")
        check(f"LoRA on 2 ranks, stage {stage}: the adapters exported", diff <= 1e-5,
              f"largest difference {diff:.2g}")
    r = run(2, lo + ["--steps", "4", "--batch", "2", "--zero", "3", "--export", tmp + "/lo3m",
                     "--export-dtype", "f32", "--lora-merge"])
    diff = largest_difference(tmp + "/lo1m/model.safetensors", tmp + "/lo3m/model.safetensors")
    check("LoRA on 2 ranks, stage 3: the merged export", r.returncode == 0 and diff <= 1e-5,
          f"largest difference {diff:.2g}")
    ck = tmp + "/lo_ck"
    losses("LoRA saved at step 3 on 2 ranks, stage 3", 2,
           lo + ["--steps", "3", "--batch", "2", "--zero", "3", "--save", ck])
    resumed = losses("LoRA resumed", 2,
                     lo + ["--steps", "4", "--batch", "2", "--zero", "1", "--resume", ck])
    compare("LoRA saved at stage 3, resumed at stage 1", resumed, {4: one[4]} if one else {})
    expect_refusal("a LoRA checkpoint resumed on another base", 2,
                   ["--lora", "4", "--lora-targets", "q,v,down", "--steps", "4", "--batch", "2",
                    "--zero", "1", "--resume", ck], "adapts other base weights")
    logits = [tmp + "/lo_one.st", tmp + "/lo_zero.st"]
    adapter = ["--init-from", base, "--init-adapter", tmp + "/lo1", "--steps", "0", "--batch", "2"]
    r1 = run(0, adapter + ["--dump-logits", logits[0]])
    r2 = run(2, adapter + ["--zero", "3", "--dump-logits", logits[1]])
    check("--init-adapter on 2 ranks, stage 3: the logits of one process",
          r1.returncode == 0 and r2.returncode == 0 and
          open(logits[0], "rb").read() == open(logits[1], "rb").read(),
          f"status {r1.returncode}, {r2.returncode}{r2.stderr[-300:]}")


def killed_saves(tmp, ck, rest):
    """A save killed at each stage, then a resume and a save over what it left."""
    for stage, want in SAVE_STAGES.items():
        d = f"{tmp}/kill_{stage}"
        shutil.copytree(ck, d)
        args = ["--steps", "6", "--batch", "3", "--zero", "2", "--resume", d, "--save", d]
        r = run(2, args, {"LLMCL_TEST_SAVE_STOP": stage})
        check(f"killed at '{stage}': the job died while saving",
              r.returncode not in (0, -1) and "at step 3" in r.stdout and "saved" not in r.stdout,
              f"status {r.returncode}{r.stderr.strip()[-300:]}")
        r = run(2, args)
        found = re.search(r"^resumed from (\S+) at step (\d+)", r.stdout, re.M)
        where = d + ".old" if stage == "aside" else d
        ok = (r.returncode == 0 and found is not None and found.group(1) == where and
              int(found.group(2)) == want and f"saved {d} at step 6" in r.stdout)
        check(f"killed at '{stage}': resumed from the checkpoint of step {want}", ok,
              f"status {r.returncode}, {found.group(0) if found else r.stderr.strip()[-300:]}")
        if want == 3:
            compare(f"killed at '{stage}': steps 4-6 after the resume", step_losses(r.stdout),
                    rest)
        left = sorted(n for n in os.listdir(tmp) if n.startswith(f"kill_{stage}"))
        check(f"killed at '{stage}': the next save leaves one folder", left == [f"kill_{stage}"],
              f"{left}")


def examples(tmp):
    """Tokenized examples whose rows hold different counts of targets that learn: 2 and 3 ranks
    give the losses of one process reading their rows (the mean over the step's targets on every
    rank), and so do 3 micro-batches a rank."""
    path = os.path.join(tmp, "sft.jsonl")
    with open(path, "w") as f:
        for i in range(90):
            prompt = [(7 * i + j) % 61 + 3 for j in range(2 + i % 11)]
            answer = [(5 * i + 3 * j) % 61 + 3 for j in range(1 + (i * 7) % 13)]
            f.write(json.dumps({"input_ids": prompt + answer,
                                "labels": [-100] * len(prompt) + answer}) + "\n")
    data = ["--data", path, "--vocab", "64", "--steps", "4"]
    one = losses("examples: one process, batch 6", 0, data + ["--batch", "6"])
    # the third: rank 0 reads rows 0, 2 and 4 of a step, rank 1 rows 1, 3 and 5, a micro-batch
    # each: the step's rows all the same, each micro-batch's mean weighed by its targets
    for ranks, stage, extra in ((2, 2, ["--batch", "3"]), (3, 3, ["--batch", "2"]),
                                (2, 1, ["--batch", "1", "--accum", "3"])):
        got = losses(f"examples: {ranks} ranks, stage {stage} {' '.join(extra)}", ranks,
                     data + extra + ["--zero", str(stage)])
        compare(f"examples: {ranks} ranks x {' '.join(extra)}, stage {stage}, against one "
                "process", got, one)


def distill(tmp):
    """--teacher under --zero (the teacher whole on every rank, the student sharded): the losses
    of one process at stages 1-3 on 2 ranks, and at a mix of the forms on 3."""
    teacher = os.path.join(tmp, "teacher")
    r = run(0, ["--steps", "8", "--batch", "4", "--export", teacher, "--export-dtype", "f32"])
    check("distill: a teacher exported", r.returncode == 0, r.stderr.strip()[-300:])
    kd = ["--teacher", teacher, "--distill-alpha", "0.7", "--distill-beta", "0.5",
          "--distill-temperature", "2", "--steps", "4"]
    one = {head: losses(f"distill: one process, {head or 'tied'}, batch 6", 0,
                        kd + ["--batch", "6"] + ([head] if head else []))
           for head in ("", "--untied")}
    for ranks, stage, head in ((2, 1, ""), (2, 2, ""), (2, 3, ""), (3, 3, "--untied")):
        extra = ["--batch", str(6 // ranks)] + ([head] if head else [])
        got = losses(f"distill: {ranks} ranks, stage {stage}", ranks,
                     kd + extra + ["--zero", str(stage)])
        compare(f"distill: {ranks} ranks x {' '.join(extra)}, stage {stage}, against one process",
                got, one[head])


def preference(tmp):
    """--preference under --zero: the reference model (the starting one, loaded again) whole on
    every rank, or a LoRA policy's own base with its adapters off, each rank its own pairs: the
    losses of one process reading them all."""
    path = os.path.join(tmp, "pairs.jsonl")
    with open(path, "w") as f:
        for i in range(30):
            prompt = [(7 * i + j) % 61 + 3 for j in range(2 + i % 5)]
            f.write(json.dumps({
                "prompt_input_ids": prompt,
                "chosen_input_ids": [(prompt[-1] + j) % 61 + 3 for j in range(1 + i % 7)],
                "rejected_input_ids": [(3 * i + 5 * j) % 61 + 3 for j in range(2 + i % 4)]}) +
                "\n")
    for loss, runs, lora in (("dpo", ((2, 1), (2, 3)), []), ("orpo", ((3, 3),), []),
                             ("dpo", ((2, 3),), ["--lora", "4", "--lr", "0.05"])):
        data = ["--data", path, "--vocab", "64", "--steps", "3", "--preference", loss] + lora
        name = " ".join([loss] + lora)
        one = losses(f"{name}: one process, batch 6", 0, data + ["--batch", "6"])
        if lora:  # the adapters move the policy off its reference, and the loss off log 2
            check(f"{name}: the loss moves off log 2", abs(one.get(3, 0.6931) - 0.6931) > 1e-3,
                  f"losses {one}")
        for ranks, stage in runs:
            extra = ["--batch", str(6 // ranks), "--zero", str(stage)]
            compare(f"{name}: {ranks} ranks x {' '.join(extra)}, against one process",
                    losses(f"{name}: {ranks} ranks, stage {stage}", ranks, data + extra), one)


def main():
    tmp = tempfile.mkdtemp(prefix="llmcl_train_zero_")
    try:
        one4 = losses("one process, batch 4", 0, ["--steps", "6", "--batch", "4"])
        for stage in (1, 2, 3):
            got = losses(f"stage {stage}", 2, ["--steps", "6", "--batch", "2", "--zero",
                                               str(stage)])
            compare(f"2 ranks x batch 2, stage {stage}, against one process at batch 4", got, one4)
        # other architectures' layers: biases (f32 vectors in the dist, added one projection at
        # a time there), the q and k norms, a head dimension and a window
        for arch in (["qwen2"], ["qwen3", "--head-dim", "48", "--sliding-window", "8"]):
            arch = ["--arch"] + arch
            one = losses(f"{arch[1]}: one process", 0, arch + ["--steps", "4", "--batch", "4"])
            for stage, extra in ((2, []), (3, []), (3, ["--recompute=ops"])):
                compare(f"{arch[1]}: 2 ranks, stage {' '.join([str(stage)] + extra)}, against "
                        "one process", losses(f"{arch[1]}, stage {stage}", 2, arch + extra + [
                            "--steps", "4", "--batch", "2", "--zero", str(stage)]), one)
        # packed examples: each rank's rows weigh by their share of the step's targets
        examples(tmp)
        # distillation: the teacher on every rank, the student's head gradient in the dist
        distill(tmp)
        # preference: the reference model on every rank
        preference(tmp)
        # recomputation inside stage 3's open layer groups: the same losses exactly
        for form in ("ops", "2"):
            same = losses(f"stage 3, --recompute={form}", 2, ["--steps", "6", "--batch", "2",
                                                             "--zero", "3", f"--recompute={form}"])
            check(f"stage 3 on 2 ranks with --recompute={form}: the losses without", same == got,
                  f"{same} against {got}")
        # two layers in a group: one group fewer (TINY's 2 layers), the same losses exactly, and a
        # checkpoint that resumes with a layer a group
        for stage in (2, 3):
            r = run(2, ["--steps", "6", "--batch", "2", "--zero", str(stage),
                        "--zero-group-layers", "2"])
            check(f"stage {stage}, --zero-group-layers 2: 2 groups",
                  "; 2 groups (2 layer(s) a group);" in r.stdout,
                  r.stdout[-300:] + r.stderr[-300:])
            merged = losses(f"stage {stage}, --zero-group-layers 2", 2, [], r)
            plain = got if stage == 3 else losses("stage 2", 2, ["--steps", "6", "--batch", "2",
                                                                 "--zero", "2"])
            check(f"stage {stage} on 2 ranks with two layers a group: the losses with one",
                  merged == plain, f"{merged} against {plain}")
        # auto: the most layers whose group the embedding's outsizes (TINY's layer is the larger:
        # one; a layer of 3.9k elements beside an embedding of 8.2k: two), the losses of that K
        small = ["--dim", "32", "--ffn", "8", "--layers", "4", "--steps", "4", "--batch", "2",
                 "--zero", "2", "--zero-group-layers"]
        r = run(2, small + ["auto"])
        check("--zero-group-layers auto, layers of 3.9k elements: two a group",
              "(2 layer(s) a group)" in r.stdout, r.stdout[-300:] + r.stderr[-300:])
        auto, two = losses("auto", 2, [], r), losses("--zero-group-layers 2", 2, small + ["2"])
        check("--zero-group-layers auto: the losses of 2", bool(auto) and auto == two,
              f"{auto} against {two}")
        r = run(2, ["--steps", "1", "--batch", "2", "--zero", "2", "--zero-group-layers", "auto"])
        check("--zero-group-layers auto, TINY's layers: one a group",
              "(1 layer(s) a group)" in r.stdout, r.stdout[-300:] + r.stderr[-300:])
        expect_refusal("--zero-group-layers many", 0, ["--zero-group-layers", "many"],
                       "expected auto or a count of layers")
        expect_refusal("--zero-group-layers auto without --zero", 0,
                       ["--steps", "1", "--batch", "2", "--zero-group-layers", "auto"],
                       "--zero-group-layers needs --zero")
        # bf16 gradients on the wire: said on the first line, the losses of one process within
        # what rounding the summed gradients to bf16 moves them (1e-4 here)
        for stage in (1, 3):
            r = run(2, ["--steps", "6", "--batch", "2", "--zero", str(stage),
                        "--zero-reduce-dtype", "bf16"])
            check(f"stage {stage}, --zero-reduce-dtype bf16: said",
                  "; bf16 gradients on the wire;" in r.stdout, r.stdout[-300:] + r.stderr[-300:])
            compare(f"stage {stage} with bf16 gradients on the wire, against one process",
                    losses(f"stage {stage}, --zero-reduce-dtype bf16", 2, [], r), one4, 2e-3)
        expect_refusal("--zero-reduce-dtype f16", 0, ["--zero-reduce-dtype", "f16"],
                       "expected bf16 or f32")
        expect_refusal("--zero-reduce-dtype bf16 without --zero", 0,
                       ["--steps", "1", "--batch", "2", "--zero-reduce-dtype", "bf16"],
                       "--zero-reduce-dtype needs --zero")
        # without clipping (whose global norm sums each rank's shards, which the groups decide)
        # every element's reduction and update are the same arithmetic: the same bits
        bits = []
        for k in ("1", "2"):
            losses(f"stage 2, --zero-group-layers {k}, --clip 0, saved", 2,
                   ["--steps", "4", "--batch", "2", "--zero", "2", "--zero-group-layers", k,
                    "--clip", "0", "--save", f"{tmp}/noclip{k}"])
            bits.append(master_bits(f"{tmp}/noclip{k}"))
        check("stage 2 without clipping: the master weights of one and two layers a group",
              bool(bits[0]) and bits[0] == bits[1], f"{len(bits[0])} and {len(bits[1])} words")
        merged_ck = tmp + "/merged"
        losses("save with two layers a group", 2, ["--steps", "3", "--batch", "2", "--zero", "3",
                                                  "--zero-group-layers", "2", "--save", merged_ck])
        compare("saved with two layers a group, resumed with one",
                losses("resume with one layer a group", 2,
                       ["--steps", "6", "--batch", "2", "--zero", "3", "--resume", merged_ck]),
                {s: got[s] for s in (4, 5, 6)})
        expect_refusal("--zero-group-layers without --zero", 0,
                       ["--steps", "1", "--batch", "2", "--zero-group-layers", "2"],
                       "--zero-group-layers needs --zero")
        one6 = losses("one process, batch 6", 0, ["--steps", "6", "--batch", "6"])
        compare("3 ranks x batch 2, stage 3, against one process at batch 6",
                losses("stage 3 on 3 ranks", 3, ["--steps", "6", "--batch", "2", "--zero", "3"]),
                one6)

        ck = tmp + "/ck"
        half = losses("save at step 3 on 2 ranks", 2, ["--steps", "3", "--batch", "3", "--zero",
                                                       "2", "--save", ck])
        compare("the first 3 steps", half, {s: one6[s] for s in (1, 2, 3)})
        rest = {s: one6[s] for s in (4, 5, 6)}
        compare("resumed on 1 rank (stage 1, batch 6)",
                losses("resume on 1", 1, ["--steps", "6", "--batch", "6", "--zero", "1",
                                          "--resume", ck]), rest)
        compare("resumed on 3 ranks (stage 3, batch 2)",
                losses("resume on 3", 3, ["--steps", "6", "--batch", "2", "--zero", "3",
                                          "--resume", ck]), rest)

        killed_saves(tmp, ck, rest)
        hugging_face(tmp)
        lora(tmp)
        for attempt in range(4):  # the kill was a race: a few runs, on 3 ranks
            expect_refusal(f"a checkpoint of another shape on 3 ranks ({attempt + 1})", 3,
                           ["--steps", "6", "--batch", "2", "--zero", "2", "--ffn", "128",
                            "--resume", ck], "another shape")
        expect_refusal("a --zero folder resumed without --zero", 0,
                       ["--steps", "6", "--batch", "6", "--resume", ck], "--zero")
        one_file = tmp + "/one.st"
        losses("a one-file checkpoint", 0, ["--steps", "1", "--batch", "4", "--save", one_file])
        expect_refusal("a one-file checkpoint resumed under --zero", 2,
                       ["--steps", "6", "--batch", "2", "--zero", "1", "--resume", one_file],
                       "not a --zero checkpoint folder")
        expect_refusal("bf16 adapters under --zero", 2,
                       ["--steps", "1", "--batch", "2", "--zero", "1", "--lora", "4",
                        "--lora-dtype", "bf16", "--dtype", "bf16"], "keeps no f32 masters")
        # --profile's steps are collective: every rank profiles, or none (its events untimed)
        r = run(2, ["--steps", "2", "--batch", "2", "--zero", "2", "--profile"])
        check("--profile on 2 ranks: both steps, or none, and no hang",
              r.returncode == 0 and (("profile of one step" in r.stdout and
                                      "one step without waits" in r.stdout) or
                                     "no profile:" in r.stdout),
              f"status {r.returncode}, {r.stdout[-300:]}{r.stderr[-300:]}")
        # where it profiles, the wall time in llmcl_dist's calls: more than nothing, less than
        # the step's wall
        wall = re.search(r"([0-9.]+) ms wall with a wait after every op", r.stdout)
        dist = re.search(r"llmcl_dist's calls +([0-9.]+) ms of the wall", r.stdout)
        if wall:
            check("--profile under --zero: the time in llmcl_dist's calls",
                  dist is not None and 0 < float(dist.group(1)) < float(wall.group(1)),
                  f"{dist.group(0) if dist else 'no line'} against {wall.group(0)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(failures)} failure(s)" + (": " + ", ".join(failures) if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
