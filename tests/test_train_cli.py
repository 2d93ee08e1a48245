#!/usr/bin/env python3
"""test_train_cli.py: llmcl-train as a user runs it. Bad configurations, missing and malformed
files and bad options fail with a clear message and status 1 (2 for unknown options); llm.c token
files train; a run resumed from a checkpoint ends with the same bits as an uninterrupted one;
models of head dim 16 and 8 train.
Ctrl-C with --save-on-interrupt, pressed once or twice, writes a checkpoint and exits 130; the
last step is saved once under --save-every; a given --warmup stands; --profile's steps come after
the sample. ORPO refuses completions that --seq cuts whole. Hugging Face checkpoints: an f32
export read back by --init-from (one file or shards) exports the same bytes, and one that fails
part-way leaves the earlier export as it was; missing tensors, wrong shapes, configs that contradict
the options fail naming them; LoRA runs resume bit for bit, only on
their own base, and export PEFT's files or the merged model; PEFT adapters load with --init-adapter
(the logits and files of the run that exported them, bit for bit), and configs or tensors the
model cannot express are refused by name. --offload-optimizer: the losses and
checkpoints of the run without it, bit for bit (with --recompute --offload too, and resumed across
the flag both ways), and a lower peak of device memory. --recompute=full|ops|N (with and without
--offload): the losses and checkpoint of the run without, bit for bit, and peaks of device memory
in the order of what each form keeps; bad forms refused; --recompute=auto takes the first form
that fits what LLMCL_MEMORY_LIMIT leaves, with the bits of the run that keeps everything. --optimizer-in-backward: the losses and
checkpoints of the run without it, bit for bit, in less device memory; what it cannot serve refused.
Tensors that the model would drop (Qwen2's q/k/v biases) are refused, named.
A file named .bin, or one that starts with llm.c's magic, that is not a whole llm.c token file is
refused (--data-format text reads it as text), and so is a folder given as --data or --val.
Tokenized examples in JSON Lines train the same whichever of labels and the masks marks what they
learn, with the same step loss under accumulation, resume bit for bit, and are refused by line
when malformed.
Output paths that cannot be written or that name one place, held-out data too short for a batch,
options that need another (--lora-alpha, --export-dtype, --packing on tokens), values beyond range
(--min-lr above 1, --lr beyond a float) and a missing --resume fail before the first step; a
checkpoint's step or data position out of range is refused; --preset=NAME and abbreviations
apply the preset; an
unknown option fails in one line (status 2); a model or batch that does not fit says which
buffer, its size, the device's limit and what to change.
The output: the first step's line gives its time instead of a speed and ETA; the peak is never
0.0; a run that saved nothing says what to try next; --profile splits a step's kernel time by op
family, then times a step without waits and says how much of its span no kernel ran (where the
device's profiling events time kernels; elsewhere it says it cannot).
--teacher distills: a student that is its own teacher has a divergence of 0, a fresh one learns,
--profile times the teacher's forward, and bad values or combinations are refused.
--preference trains on tokenized pairs: DPO's first loss is log 2 against the starting model (also
from --init-from, with LoRA, and given as --ref), IPO's 1 / (2 beta)^2, the loss falls on a tiny
set with the rewards' accuracy at 1, two micro-batches give one's losses (ORPO's supervised term
too), a run resumes bit for bit, SimPO, CPO and ORPO train, --profile times the reference's
forward, and bad values, combinations and lines are refused.

    python3 tests/test_train_cli.py build/tools/llmcl-train
"""
import json
import os
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

TRAIN = sys.argv[1]
TINY = ["--dim", "64", "--heads", "2", "--kv-heads", "1", "--ffn", "96", "--layers", "1",
        "--batch", "2", "--seq", "16", "--eval-every", "0", "--sample", "0", "--log-every", "1"]
failures = []


def run(args, timeout=300, env=None):
    return subprocess.run([TRAIN] + args, capture_output=True, text=True, timeout=timeout,
                          env=None if env is None else {**os.environ, **env})


def expect_error(what, args, needle, code=1):
    r = run(args)
    ok = r.returncode == code and needle in r.stderr
    print(f"{'ok  ' if ok else 'FAIL'} {what}: status {r.returncode}, {r.stderr.strip()[:160]}")
    if not ok:
        failures.append(what)


def expect_ok(what, args, env=None):
    r = run(args, env=env)
    ok = r.returncode == 0
    print(f"{'ok  ' if ok else 'FAIL'} {what}: status {r.returncode}")
    if not ok:
        print(r.stdout[-2000:], r.stderr[-2000:])
        failures.append(what)
    return r


# What --profile prints where the device's profiling events do not time kernels (rusticl).
UNTIMED = re.compile(r"^no profile: this device's profiling events time a [\d.]+ ms fill at",
                     re.M)


def profile_row(stdout, name):
    """--profile's row of a frozen model's forward, and whether it is right: one row with a time,
    or none where the device says its events do not time kernels."""
    row = [x.split() for x in stdout.splitlines() if x.strip().startswith(name)]
    if UNTIMED.search(stdout):
        return row, not row
    return row, len(row) == 1 and float(row[0][2]) > 0


def llmc_file(path, tokens, magic=20240520, version=1, count=None, width="H"):
    header = [0] * 256
    header[0], header[1], header[2] = magic, version, len(tokens) if count is None else count
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(tokens)}{width}", *tokens))


def read_st(path):
    """A safetensors file as (metadata, {name: (dtype, shape, bytes)})."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    body = data[8 + n:]
    return meta, {k: (v["dtype"], v["shape"], body[v["data_offsets"][0]:v["data_offsets"][1]])
                  for k, v in header.items()}


def write_st(path, tensors, meta=None):
    header, blobs, offset = {"__metadata__": meta or {}}, [], 0
    for name in sorted(tensors):
        dtype, shape, blob = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def check(what, ok):
    print(f"{'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        failures.append(what)


def losses(out):
    """The progress lines' loss and gradient norm, as printed."""
    return re.findall(r"^step +\d+/\d+ \| (loss \S+ \| norm \S+)", out, re.M)


def memory(out):
    """The peak of device memory and the last progress line's, in MiB."""
    peak = re.search(r"device memory: peak ([\d.]+) MiB", out)
    last = re.findall(r"\| mem ([\d.]+) MiB", out)
    return float(peak.group(1)) if peak else 0.0, float(last[-1]) if last else 0.0


def same_files(what, a, b):
    same = os.path.exists(a) and os.path.exists(b) and open(a, "rb").read() == open(b, "rb").read()
    print(f"{'ok  ' if same else 'FAIL'} {what}")
    if not same:
        failures.append(what)


def unused_tensors(p, tensors):
    """Tensors the model would drop (biases a Llama config lacks, another module) are refused by
    name."""
    biased = dict(tensors)
    for k in ("q", "k", "v"):
        biased[f"model.layers.0.self_attn.{k}_proj.bias"] = ("F32", [64], bytes(256))
    write_st(p("biased.safetensors"), biased)
    expect_error("Qwen2's biases in one file", TINY + ["--init-from", p("biased.safetensors")],
                 "model.layers.0.self_attn.k_proj.bias, model.layers.0.self_attn.q_proj.bias, "
                 "model.layers.0.self_attn.v_proj.bias: tensors that llmcl-train's model of this "
                 "config does not use")
    os.mkdir(p("biased"))
    shutil.copy(p("e1/config.json"), p("biased/config.json"))  # says llama, no biases
    shutil.copy(p("biased.safetensors"), p("biased/model.safetensors"))
    expect_error("biases in a folder whose config says llama", TINY + ["--init-from", p("biased")],
                 "q_proj.bias")
    # RoPE's frequencies, which early checkpoints saved, are derived, as transformers ignores them
    freq = dict(tensors)
    freq["model.layers.0.self_attn.rotary_emb.inv_freq"] = ("F32", [16], bytes(64))
    write_st(p("freq.safetensors"), freq)
    expect_ok("rotary_emb.inv_freq is ignored", TINY + ["--steps", "0", "--init-from",
                                                        p("freq.safetensors")])
    freq.update((k, v) for k, v in biased.items() if k.endswith("bias"))
    freq["model.mm_projector.weight"] = ("F32", [2], bytes(8))
    write_st(p("many.safetensors"), freq)
    expect_error("three unused tensors named, then a count", TINY + ["--init-from",
                                                                     p("many.safetensors")],
                 "v_proj.bias and 1 more: tensors")


def hugging_face(p):
    """--init-from and --export."""
    expect_ok("train and export f32", TINY + ["--steps", "3", "--export", p("e1"),
                                              "--export-dtype", "f32"])
    expect_ok("init from the export", TINY + ["--steps", "0", "--init-from", p("e1"), "--export",
                                              p("e2"), "--export-dtype", "f32"])
    same_files("export -> --init-from -> export is bit-exact",
               p("e1/model.safetensors"), p("e2/model.safetensors"))
    meta, tensors = read_st(p("e1/model.safetensors"))
    os.mkdir(p("shards"))
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in halves.items():
        write_st(os.path.join(p("shards"), file), {n: tensors[n] for n in part}, meta)
    with open(p("shards/model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": {n: fl for fl, part in halves.items()
                                                  for n in part}}, f)
    shutil.copy(p("e1/config.json"), p("shards/config.json"))
    expect_ok("init from shards", TINY + ["--steps", "0", "--init-from", p("shards"), "--export",
                                          p("e3"), "--export-dtype", "f32"])
    same_files("sharded --init-from exports the same bytes",
               p("e1/model.safetensors"), p("e3/model.safetensors"))
    # a tensor in a shard other than weight_map's (here a second copy, of zeros) was read from
    # whichever shard was opened first
    shutil.copytree(p("shards"), p("two_copies"))
    second = {n: tensors[n] for n in halves["model-00002-of-00002.safetensors"]}
    dtype, shape, blob = tensors["model.embed_tokens.weight"]
    second["model.embed_tokens.weight"] = (dtype, shape, bytes(len(blob)))
    write_st(p("two_copies/model-00002-of-00002.safetensors"), second, meta)
    expect_error("a tensor in a shard that weight_map does not put it in",
                 TINY + ["--init-from", p("two_copies")],
                 "model-00002-of-00002.safetensors holds model.embed_tokens.weight, which "
                 "weight_map puts in model-00001-of-00002.safetensors")
    # past --export-shard-gb: shards and Hugging Face's index, read back as the one file, and an
    # export of the other form into the folder removes them once it is whole
    expect_ok("a sharded export", TINY + ["--steps", "0", "--init-from", p("e1"), "--export",
                                          p("es"), "--export-dtype", "f32",
                                          "--export-shard-gb", "0.00003"])
    written = sorted(f for f in os.listdir(p("es")) if f.startswith("model-"))
    index = json.load(open(p("es/model.safetensors.index.json")))
    count = len(written)
    check(f"{count} shards named as save_pretrained names them, and their index",
          count > 2 and written == [f"model-{k:05d}-of-{count:05d}.safetensors"
                                    for k in range(1, count + 1)] and
          sorted(index["weight_map"]) == names and set(index["weight_map"].values()) ==
          set(written) and index["metadata"]["total_size"] == sum(len(t[2])
                                                                  for t in tensors.values()))
    expect_ok("init from the sharded export", TINY + ["--steps", "0", "--init-from", p("es"),
                                                      "--export", p("es1"), "--export-dtype",
                                                      "f32"])
    same_files("the sharded export read back: the one file's bytes",
               p("e1/model.safetensors"), p("es1/model.safetensors"))
    expect_ok("a one-file export over the shards", TINY + ["--steps", "0", "--init-from", p("e1"),
                                                           "--export", p("es"),
                                                           "--export-dtype", "f32"])
    check("the shards and their index removed",
          sorted(os.listdir(p("es"))) == ["config.json", "model.safetensors"])
    # found by tests/fuzz/fuzz_hf_config: an empty weight_map (here the last of two, which wins
    # as in Python) opened no shard, and the run then called every tensor missing
    os.mkdir(p("no_shards"))
    shutil.copy(p("e1/config.json"), p("no_shards/config.json"))
    with open(p("no_shards/model.safetensors.index.json"), "w") as f:
        f.write('{"weight_map": {"x": "model.safetensors"}, "weight_map": {}}')
    expect_error("an index whose weight_map is empty", TINY + ["--init-from", p("no_shards")],
                 "model.safetensors.index.json: weight_map names no tensors")

    unused_tensors(p, tensors)
    missing = dict(tensors)
    del missing["model.layers.0.mlp.up_proj.weight"]
    write_st(p("missing.safetensors"), missing)
    expect_error("a missing tensor", TINY + ["--init-from", p("missing.safetensors")],
                 "missing tensor model.layers.0.mlp.up_proj.weight")
    expect_error("a tensor of another shape", TINY + ["--ffn", "128", "--init-from",
                                                      p("e1/model.safetensors")],
                 "gate_proj.weight is [96, 64] there, the model expects [128, 64]")
    # a crafted file: an empty tensor of eight huge dimensions, whose shape's text once ran past
    # its 64-byte buffer on the stack (ASan: stack-buffer-overflow); now named whole
    huge = dict(tensors)
    huge["model.embed_tokens.weight"] = ("BF16", [0] + [10 ** 18] * 7, b"")
    write_st(p("huge_dims.safetensors"), huge)
    expect_error("a tensor of eight huge dimensions", TINY + ["--init-from",
                                                             p("huge_dims.safetensors")],
                 "embed_tokens.weight is [0" + ", 1000000000000000000" * 7 + "] there")
    expect_error("an option that contradicts config.json", TINY + ["--dim", "128", "--init-from",
                                                                   p("e1")],
                 "--dim 128 conflicts with hidden_size = 64")
    expect_error("a sequence beyond max_position_embeddings", TINY + ["--seq", "32", "--init-from",
                                                                      p("e1")],
                 "exceeds max_position_embeddings = 16")
    untied = dict(tensors)
    untied["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    write_st(p("untied.safetensors"), untied)
    expect_error("lm_head.weight for a tied head", TINY + ["--init-from", p("untied.safetensors")],
                 "give --untied")
    os.mkdir(p("yarn"))
    config = json.load(open(p("e1/config.json")))
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    json.dump(config, open(p("yarn/config.json"), "w"))
    shutil.copy(p("e1/model.safetensors"), p("yarn/model.safetensors"))
    expect_error("an unsupported rope_scaling", TINY + ["--init-from", p("yarn")],
                 "rope_scaling of a type other than default or llama3 is not supported")
    # a Llama 3 factor whose export's max_position_embeddings (8192 times it) passes an int's
    # range: config.json had "max_position_embeddings": -2147483648
    config["rope_scaling"] = {"rope_type": "llama3", "factor": 1e9}
    json.dump(config, open(p("yarn/config.json"), "w"))
    for what, args in (("config.json's", ["--init-from", p("yarn")]),
                       ("--rope-llama3's", ["--rope-llama3", "1e9"])):
        expect_error(f"{what} Llama 3 RoPE factor of 1e9", TINY + args + [
            "--steps", "0", "--export", p("huge_factor")], "must be from 0 (off) to 131072")
    # found with tests/fuzz/fuzz_hf_config: these were accepted (NaN training from an eps of 1e105
    # or a theta of 0; a signed overflow of head_dim x num_attention_heads under UBSan, whose
    # config TINY's --heads now contradicts first)
    for key, value, needle in (("rope_theta", 0, "rope_theta = 0 must be > 0"),
                               ("rms_norm_eps", -1e-5, "rms_norm_eps = -1e-05 is not a non-negat"),
                               ("rms_norm_eps", 1e39, "rms_norm_eps = 1e+39 is not a non-negat"),
                               ("head_dim", 1 << 30, "--heads 2 conflicts with num_attention_h")):
        folder = p(f"bad_{key}_{value}")
        os.mkdir(folder)
        config = json.load(open(p("e1/config.json")))
        config[key] = value
        if key == "head_dim":
            config["num_attention_heads"] = 1 << 30
        json.dump(config, open(folder + "/config.json", "w"))
        shutil.copy(p("e1/model.safetensors"), folder + "/model.safetensors")
        expect_error(f"config.json's {key} = {value}", TINY + ["--init-from", folder], needle)
    # transformers 5 writes RoPE's base and scaling as rope_parameters: the same model as the
    # legacy rope_theta + rope_scaling keys
    for name, rope in (("legacy", None), ("v5", "rope_parameters")):
        os.mkdir(p(name))
        config = json.load(open(p("e1/config.json")))
        config.pop("rope_scaling", None)
        config["max_position_embeddings"] = 131072
        scaling = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
        if rope:
            config.pop("rope_theta", None)
            config[rope] = dict(scaling, rope_theta=500000.0)
        else:
            config["rope_theta"], config["rope_scaling"] = 500000.0, scaling
        json.dump(config, open(p(name + "/config.json"), "w"))
        shutil.copy(p("e1/model.safetensors"), p(name + "/model.safetensors"))
        expect_ok(f"RoPE from {name} keys", TINY + ["--steps", "0", "--init-from", p(name),
                                                   "--dump-logits", p(name + ".st")])
    same = open(p("legacy.st"), "rb").read() == open(p("v5.st"), "rb").read()
    print(f"{'ok  ' if same else 'FAIL'} rope_parameters and rope_scaling give the same logits")
    if not same:
        failures.append("rope_parameters")
    expect_ok("dump the logits", TINY + ["--steps", "0", "--init-from", p("e1"), "--dump-logits",
                                         p("logits.st")])
    meta, dump = read_st(p("logits.st"))
    ok = dump["logits"][1] == [2, 16, 256] and dump["input_ids"][1] == [2, 16] and "loss" in meta
    print(f"{'ok  ' if ok else 'FAIL'} --dump-logits writes logits [2, 16, 256], tokens and loss")
    if not ok:
        failures.append("dump-logits")


def file_size_limit(size):
    """A child's limit on the size of any file it writes, past which a write fails with EFBIG
    (SIGXFSZ ignored, which would kill it), as a full disk fails one."""
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return limit


def folder_bytes(folder):
    return {f: open(os.path.join(folder, f), "rb").read() for f in sorted(os.listdir(folder))}


def failed_export(p):
    """An export that fails part-way leaves the earlier export in its folder as it was: its
    fourth shard of 4 MiB fails under a 3 MiB limit on files, after the first three were written
    (each had been renamed into place at once, beside the old shards and index: a mixed model that
    loaded), and no temporary file stays behind."""
    args = TINY + ["--ffn", "16384", "--steps", "0", "--export", p("whole"), "--export-dtype",
                   "f32", "--export-shard-gb", "0.00003"]
    expect_ok("a sharded export of 4 MiB tensors", args)
    before = folder_bytes(p("whole"))
    r = subprocess.run([TRAIN] + args + ["--seed", "2"], capture_output=True, text=True,
                       timeout=300, preexec_fn=file_size_limit(3 << 20))
    check("an export over it fails writing its fourth shard",
          r.returncode == 1 and "model-00004-of-00007.safetensors" in r.stderr and
          "File too large" in r.stderr)
    check("the earlier export is left whole, with nothing beside it",
          folder_bytes(p("whole")) == before)


def architectures(p):
    """--arch and the layers it brings (biases, q and k norms, another head dimension, a sliding
    window): each exports its own config.json, reads back bit for bit, resumes, and adapts."""
    shapes = {"qwen3": ["--head-dim", "48", "--sliding-window", "8"], "qwen2": [],
              "mistral": ["--sliding-window", "8"]}
    for arch, extra in shapes.items():
        args = TINY + ["--arch", arch] + extra
        r = expect_ok(f"--arch {arch}: train and export", args + [
            "--steps", "3", "--export", p(arch), "--export-dtype", "f32"])
        loss = [float(x.split()[1]) for x in losses(r.stdout)]
        check(f"--arch {arch}: 3 finite losses, falling",
              len(loss) == 3 and all(x == x for x in loss) and loss[-1] < loss[0])
        config = json.load(open(p(arch + "/config.json")))
        _, tensors = read_st(p(arch + "/model.safetensors"))
        layer = "model.layers.0.self_attn."
        want = {"qwen3": {"q_norm.weight": [48], "k_norm.weight": [48], "q_proj.weight": [96, 64]},
                "qwen2": {"q_proj.bias": [64], "k_proj.bias": [32], "v_proj.bias": [32]},
                "mistral": {}}[arch]
        check(f"--arch {arch}: config.json and tensors",
              config["model_type"] == arch and
              all(tensors.get(layer + k, (0, None))[1] == v for k, v in want.items()) and
              (layer + "o_proj.bias") not in tensors and
              (arch == "qwen2" or (layer + "q_proj.bias") not in tensors) and
              config.get("sliding_window") == (8 if extra[-1:] == ["8"] else None) and
              (arch != "qwen3" or (config["head_dim"] == 48 and config["use_sliding_window"]
                                   and config["max_window_layers"] == 0)))
        expect_ok(f"--arch {arch}: init from the export", TINY + [
            "--steps", "0", "--init-from", p(arch), "--export", p(arch + "2"),
            "--export-dtype", "f32"])
        same_files(f"--arch {arch}: export -> --init-from -> export is bit-exact",
                   p(arch + "/model.safetensors"), p(arch + "2/model.safetensors"))
    # a checkpoint resumes only as the model that wrote it
    flat = TINY + ["--arch", "qwen2", "--min-lr", "1"]
    expect_ok("qwen2: 3 steps", flat + ["--steps", "3", "--save", p("q2.st")])
    expect_ok("qwen2: resumed", flat + ["--steps", "4", "--resume", p("q2.st")])
    expect_error("a qwen2 checkpoint resumed as llama", TINY + ["--resume", p("q2.st")],
                 "arch is qwen2 there and llama here")
    expect_error("a Llama checkpoint resumed as qwen3", TINY + [
        "--arch", "qwen3", "--resume", p("half.st")], "arch is llama there and qwen3 here")
    r = expect_ok("LoRA on qwen2: biases frozen", TINY + [
        "--init-from", p("qwen2"), "--lora", "4", "--steps", "2", "--export", p("q2lora")])
    _, adapters = read_st(p("q2lora/adapter_model.safetensors"))
    check("LoRA on qwen2: the adapter holds adapters only",
          adapters and all(".lora_" in k for k in adapters))
    # what the architectures cannot say, and configs that llmcl-train's model cannot express
    for what, args, needle in (
            ("an unknown --arch", ["--arch", "gemma"], "expected llama, mistral"),
            ("a sliding window on llama", ["--sliding-window", "8"],
             "the layers differ from the architecture's"),
            ("--arch against config.json", ["--arch", "qwen2", "--init-from", p("qwen3")],
             "--arch qwen2 conflicts with model_type = qwen3"),
            ("--head-dim against config.json", ["--head-dim", "32", "--init-from", p("qwen3")],
             "--head-dim 32 conflicts with head_dim = 48")):
        expect_error(what, TINY + args, needle)
    for name, change, needle in (
            ("gemma", {"model_type": "gemma"}, 'model_type gemma: llmcl-train reads "llama"'),
            ("all_sliding", {"layer_types": ["sliding_attention"], "num_hidden_layers": 1,
                       "use_sliding_window": True, "max_window_layers": 0},
             None),
            ("some", {"use_sliding_window": True, "max_window_layers": 1, "num_hidden_layers": 2,
                      "layer_types": None}, "a sliding window on 1 of 2 layers"),
            ("types", {"layer_types": ["full_attention", "chunked_attention"]},
             'layer_types holds "chunked_attention"'),
            ("head_dim", {"head_dim": 4}, "head dimension 4 must be a multiple of 8")):
        os.mkdir(p("cfg_" + name))
        config = json.load(open(p("qwen3/config.json")))
        config.update(change)
        json.dump(config, open(p(f"cfg_{name}/config.json"), "w"))
        shutil.copy(p("qwen3/model.safetensors"), p(f"cfg_{name}/model.safetensors"))
        if needle:
            expect_error(f"config.json: {name}", TINY + ["--init-from", p("cfg_" + name)], needle)
        else:
            expect_ok(f"config.json: {name}", TINY + ["--steps", "0", "--init-from",
                                                      p("cfg_" + name)])


def lora(p):
    """LoRA runs on the exported base of hugging_face()."""
    base = TINY + ["--init-from", p("e1"), "--lora", "4", "--lora-targets", "q,v,down"]
    expect_error("an unknown LoRA target", base + ["--lora-targets", "q,x"], "'x' is not one of")
    expect_error("--lora-merge without LoRA", TINY + ["--lora-merge"], "give --lora R")
    expect_error("bf16 adapters on an f32 model", base + ["--dtype", "f32", "--lora-dtype", "bf16"],
                 "the LoRA dtype must be f32, or bf16 with a bf16 model")
    flat = base + ["--min-lr", "1"]
    expect_ok("LoRA 6 steps", flat + ["--steps", "6", "--save", p("lora.st")])
    expect_ok("LoRA 3 steps", flat + ["--steps", "3", "--save", p("lora_half.st")])
    r = expect_ok("LoRA resume for 3 more", flat + ["--steps", "6", "--resume", p("lora_half.st"),
                                                     "--save", p("lora_resumed.st")])
    if "at step 3" not in r.stdout:
        failures.append("LoRA resume from step 3")
    same_files("a resumed LoRA checkpoint identical to the uninterrupted one",
               p("lora.st"), p("lora_resumed.st"))
    _, ck = read_st(p("lora.st"))
    ok = all(n.startswith(("base_model.model.", "optimizer.")) for n in ck) and len(ck) == 18
    print(f"{'ok  ' if ok else 'FAIL'} a LoRA checkpoint holds the adapters and their moments only")
    if not ok:
        failures.append("lora checkpoint contents")
    expect_error("a LoRA resume on another base", TINY + ["--lora", "4", "--lora-targets",
                                                          "q,v,down", "--resume", p("lora.st")],
                 "adapts other base weights")
    expect_error("a LoRA checkpoint resumed without LoRA", TINY + ["--resume", p("lora.st")],
                 "is a LoRA checkpoint and this run does not use LoRA")
    expect_ok("bf16 adapters", base + ["--lora-dtype", "bf16", "--steps", "2", "--save",
                                       p("lora16.st")])
    _, ck = read_st(p("lora16.st"))
    ok = ck["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"][0] == "BF16"
    print(f"{'ok  ' if ok else 'FAIL'} bf16 adapters are saved in bf16")
    if not ok:
        failures.append("bf16 adapters")
    expect_ok("LoRA adapters exported", base + ["--steps", "2", "--export", p("adapters")])
    _, ad = read_st(p("adapters/adapter_model.safetensors"))
    config = json.load(open(p("adapters/adapter_config.json")))
    ok = ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in ad and len(ad) == 6
          and config["r"] == 4 and config["target_modules"] == ["q_proj", "v_proj", "down_proj"]
          and config["peft_type"] == "LORA")
    print(f"{'ok  ' if ok else 'FAIL'} PEFT's adapter files")
    if not ok:
        failures.append("adapter export")
    expect_ok("LoRA merged export", base + ["--steps", "2", "--export", p("merged"),
                                            "--lora-merge"])
    _, merged = read_st(p("merged/model.safetensors"))
    ok = sorted(merged) == sorted(read_st(p("e1/model.safetensors"))[1])
    print(f"{'ok  ' if ok else 'FAIL'} the merged export has the base model's tensors")
    if not ok:
        failures.append("merged export")


def peft_adapter(p):
    """--init-adapter: PEFT's adapter folders onto the base of hugging_face(), from lora()'s export
    format: the same logits bit for bit, the same files exported again, and every adapter config
    or tensor the model cannot express refused by name."""
    base = TINY + ["--init-from", p("e1")]
    lora = base + ["--lora", "4", "--lora-alpha", "8", "--lora-targets", "q,v,down"]
    expect_ok("LoRA trained, adapters exported in f32",
              lora + ["--steps", "4", "--export", p("ad"), "--export-dtype", "f32",
                      "--dump-logits", p("ad.st")])
    r = expect_ok("--init-adapter", base + ["--init-adapter", p("ad"), "--steps", "0",
                                            "--dump-logits", p("ad_loaded.st"), "--export",
                                            p("ad_again"), "--export-dtype", "f32"])
    check("--init-adapter takes rank, alpha and targets from adapter_config.json",
          "LoRA: rank 4, alpha 8, f32 adapters on q_proj v_proj down_proj" in r.stdout)
    same_files("logits through a loaded adapter, bit for bit", p("ad.st"), p("ad_loaded.st"))
    check("the adapter changes the base's logits",
          open(p("ad.st"), "rb").read() != open(p("logits.st"), "rb").read())
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        same_files(f"an adapter loaded and exported again: the same {name}",
                   p("ad/" + name), p("ad_again/" + name))
    expect_ok("--init-adapter into bf16 adapters", base + ["--init-adapter", p("ad"),
                                                           "--lora-dtype", "bf16", "--steps", "1"])
    expect_ok("explicit options that agree", lora + ["--init-adapter", p("ad"), "--steps", "0"])
    # a resume repeats the command: the checkpoint's adapters replace the loaded ones
    flat = base + ["--init-adapter", p("ad"), "--min-lr", "1"]
    expect_ok("6 steps from an adapter", flat + ["--steps", "6", "--save", p("ad6.st")])
    expect_ok("3 steps from an adapter", flat + ["--steps", "3", "--save", p("ad3.st")])
    expect_ok("and 3 more resumed", flat + ["--steps", "6", "--resume", p("ad3.st"),
                                            "--save", p("ad36.st")])
    same_files("a resumed run from an adapter ends as the uninterrupted one",
               p("ad6.st"), p("ad36.st"))
    # the adapter merged into its base: a whole model whose loss is the adapter's
    expect_ok("an adapter merged into its base", base + ["--init-adapter", p("ad"), "--steps", "0",
                                                         "--lora-merge", "--export", p("ad_merged"),
                                                         "--export-dtype", "f32"])
    expect_ok("the merged model", TINY + ["--init-from", p("ad_merged"), "--steps", "0",
                                          "--dump-logits", p("ad_merged.st")])
    loss = [float(read_st(p(f))[0]["loss"]) for f in ("ad.st", "ad_merged.st")]
    check(f"the merged model's loss {loss[1]:.6f} is the adapter's {loss[0]:.6f}",
          abs(loss[0] - loss[1]) < 1e-2)

    config = json.load(open(p("ad/adapter_config.json")))
    _, tensors = read_st(p("ad/adapter_model.safetensors"))

    def adapter(name, changes=None, tensor_map=None):
        folder = p(name)
        os.mkdir(folder)
        json.dump({**config, **(changes or {})}, open(folder + "/adapter_config.json", "w"))
        write_st(folder + "/adapter_model.safetensors", tensor_map or tensors)
        return folder

    # use_rslora scales by alpha / sqrt(r): alpha 4 at r 4 is alpha 8 without it
    expect_ok("use_rslora", base + ["--init-adapter", adapter("rslora", {"use_rslora": True,
                                                                        "lora_alpha": 4}),
                                    "--steps", "0", "--dump-logits", p("rslora.st")])
    same_files("use_rslora's scale taken as alpha sqrt(r)", p("ad.st"), p("rslora.st"))
    # PEFT 0.21 saves "all-linear" as the paths of every adapted module
    paths = ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj",
             "model.layers.0.mlp.down_proj"]
    expect_ok("target_modules as paths", base + ["--init-adapter",
                                                 adapter("paths", {"target_modules": paths}),
                                                 "--steps", "0", "--dump-logits", p("paths.st")])
    same_files("target_modules as paths: the adapter named by module", p("ad.st"), p("paths.st"))
    # without --init-from, the base that adapter_config.json names (an export writes the
    # absolute path of its --init-from; PEFT's AutoPeftModel reads it the same way)
    check("the export names its base", config["base_model_name_or_path"] ==
          os.path.realpath(p("e1")))
    expect_ok("--init-adapter finding its base", TINY + ["--init-adapter", p("ad"), "--steps",
                                                         "0", "--dump-logits", p("ad_base.st")])
    same_files("--init-adapter finding its base: the logits with --init-from", p("ad.st"),
               p("ad_base.st"))
    for name, named, needle in (("none", None, "names none"),
                                ("hub", "meta-llama/Llama-3.2-1B",
                                 "names meta-llama/Llama-3.2-1B, which is not a file or folder")):
        expect_error(f"--init-adapter without --init-from, base {name}",
                     TINY + ["--init-adapter", adapter(f"ad_base_{name}",
                                                       {"base_model_name_or_path": named})],
                     needle)
    for opt, value, needle in (("--lora", "8", "--lora 8 conflicts with r = 4"),
                               ("--lora-alpha", "3", "--lora-alpha 3 conflicts with lora_alpha"),
                               ("--lora-targets", "q,v", "--lora-targets conflicts with "
                                                         "target_modules")):
        expect_error(f"{opt} {value} against the adapter's config",
                     base + ["--init-adapter", p("ad"), opt, value], needle)
    expect_error("an adapter that is not a folder",
                 base + ["--init-adapter", p("ad/adapter_config.json")], "not a folder")
    os.mkdir(p("ad_pickle"))
    shutil.copy(p("ad/adapter_config.json"), p("ad_pickle/adapter_config.json"))
    expect_error("an adapter saved as a pickle", base + ["--init-adapter", p("ad_pickle")],
                 "safe_serialization=True")
    os.mkdir(p("ad_no_config"))
    shutil.copy(p("ad/adapter_model.safetensors"), p("ad_no_config/adapter_model.safetensors"))
    expect_error("an adapter without its config", base + ["--init-adapter", p("ad_no_config")],
                 "holds no adapter_config.json")
    for i, (changes, needle) in enumerate((
            ({"peft_type": "PREFIX_TUNING"}, 'peft_type must be "LORA"'),
            ({"use_dora": True}, "use_dora (DoRA's magnitudes) is not supported"),
            ({"bias": "lora_only"}, 'bias must be "none"'),
            ({"fan_in_fan_out": True}, "fan_in_fan_out (GPT-2's transposed weights)"),
            ({"alpha_pattern": {"q_proj": 16}}, "alpha_pattern (alphas per module)"),
            ({"layers_to_transform": [0]}, "layers_to_transform (adapters on some layers)"),
            ({"modules_to_save": ["lm_head"]}, "modules_to_save (whole modules"),
            ({"target_modules": ".*\\.(q|v)_proj"}, "a regular expression is not supported"),
            ({"target_modules": ["q_proj", "lm_head"]}, "target_modules names lm_head"),
            # found by tests/fuzz/fuzz_hf_config: "" matched the norm between o_proj and gate_proj
            ({"target_modules": [""]}, "target_modules names : llmcl-train adapts"),
            ({"target_modules": ["model.layers.0.mlp."]},
             "target_modules names model.layers.0.mlp."),
            ({"r": 0}, "r = 0 must be from 1 to 65536"),
            ({"lora_alpha": -2}, "lora_alpha = -2 must be a positive float"),
            ({"r": 8}, "lora_A.weight is [4, 64] there, the model expects [8, 64]"))):
        expect_error(f"adapter_config.json with {changes}",
                     base + ["--init-adapter", adapter(f"ad_bad{i}", changes)], needle)
    missing = dict(tensors)
    del missing["base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"]
    expect_error("an adapter missing a tensor",
                 base + ["--init-adapter", adapter("ad_missing", tensor_map=missing)],
                 "missing tensor base_model.model.model.layers.0.mlp.down_proj.lora_B.weight")
    dora = dict(tensors)
    dora["base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector"] = (
        "F32", [64], bytes(256))
    expect_error("DoRA's magnitudes in the tensors",
                 base + ["--init-adapter", adapter("ad_dora", tensor_map=dora)],
                 "q_proj.lora_magnitude_vector: tensors that llmcl-train's model of this config")
    expect_error("adapters on a module that target_modules leaves out",
                 base + ["--init-adapter", adapter("ad_fewer", {"target_modules": ["q_proj",
                                                                                   "v_proj"]})],
                 "down_proj.lora_A.weight, base_model.model.model.layers.0.mlp.down_proj.lora_B")


def offload_optimizer(p, flat, straight):
    """--offload-optimizer against the 6- and 3-step runs of main() (straight: the 6 steps')."""
    # 0.05 MiB: 11 chunks of 4352 elements, the embedding split over four of them
    off = ["--offload-optimizer", "--offload-chunk-mib", "0.05"]
    r = expect_ok("--offload-optimizer 6 steps", flat + off + ["--steps", "6", "--save", p("oo.st")])
    check("--offload-optimizer: the same losses and norms",
          len(losses(r.stdout)) == 6 and losses(r.stdout) == losses(straight.stdout))
    same_files("--offload-optimizer: the same checkpoint", p("straight.st"), p("oo.st"))
    peak, mem = memory(r.stdout)
    base_peak, base_mem = memory(straight.stdout)
    check(f"--offload-optimizer: less device memory (peak {peak} < {base_peak} MiB, "
          f"progress line {mem} < {base_mem} MiB)", 0 < peak < base_peak and 0 < mem < base_mem)
    r = expect_ok("--recompute --offload --offload-optimizer",
                  flat + off + ["--recompute", "--offload", "--steps", "6", "--save", p("oo_rec.st")])
    check("--recompute --offload --offload-optimizer: the same losses and norms",
          losses(r.stdout) == losses(straight.stdout))
    same_files("--recompute --offload --offload-optimizer: the same checkpoint", p("straight.st"),
               p("oo_rec.st"))
    r = expect_ok("a checkpoint without the flag resumed with it",
                  flat + off + ["--steps", "6", "--resume", p("half.st"), "--save", p("oo_r1.st")])
    check("resumed with --offload-optimizer: steps 4-6 as before",
          losses(r.stdout) == losses(straight.stdout)[3:])
    same_files("resumed with --offload-optimizer: the same checkpoint", p("straight.st"),
               p("oo_r1.st"))
    expect_ok("--offload-optimizer 3 steps", flat + off + ["--steps", "3", "--save", p("oo_half.st")])
    r = expect_ok("a checkpoint with the flag resumed without it",
                  flat + ["--steps", "6", "--resume", p("oo_half.st"), "--save", p("oo_r2.st")])
    check("resumed without --offload-optimizer: steps 4-6 as before",
          losses(r.stdout) == losses(straight.stdout)[3:])
    same_files("resumed without --offload-optimizer: the same checkpoint", p("straight.st"),
               p("oo_r2.st"))
    expect_error("--offload-optimizer under --zero", TINY + off + ["--zero", "1"],
                 "ZeRO already shards the optimizer state")
    expect_error("--offload-optimizer on an f32 model", TINY + off + ["--dtype", "f32"],
                 "give --dtype bf16 or f16")
    expect_error("--offload-optimizer with LoRA", TINY + off + ["--lora", "4"], "full training")
    expect_error("--offload-chunk-mib alone", TINY + ["--offload-chunk-mib", "1"], "give both")


def recompute_forms(p):
    """--recompute's forms on 5 layers (a multiple of neither 2 nor 3): the losses and checkpoint
    of the run that keeps everything, bit for bit, with and without --offload; the start-up line
    names the form; the peaks of device memory in the order of what each form keeps."""
    base = TINY + ["--layers", "5", "--batch", "4", "--seq", "64", "--min-lr", "1", "--steps", "3"]
    keep = expect_ok("5 layers, all activations kept", base + ["--save", p("rc_none.st")])
    peaks = {"none": memory(keep.stdout)[0]}
    forms = (("--recompute", "full activation checkpointing"),
             ("--recompute=full", "full activation checkpointing"),
             ("--recompute=ops", "selective activation checkpointing of ops"),
             ("--recompute=2", "selective activation checkpointing of every 2nd layer (2 of 5"),
             ("--recompute=3", "selective activation checkpointing of every 3rd layer (1 of 5"))
    for form, words in forms:
        for offload in ([], ["--offload"]):
            name = form + "".join(" " + o for o in offload)
            r = expect_ok(name, base + [form] + offload + ["--save", p("rc.st")])
            model = re.search(r"^model: .*$", r.stdout, re.M)
            line = model.group(0) if model else ""
            check(f"{name}: the start-up line names the form: {line[-100:]}",
                  words in line and line.endswith(" with offload") == bool(offload))
            check(f"{name}: the same losses and norms",
                  len(losses(r.stdout)) == 3 and losses(r.stdout) == losses(keep.stdout))
            same_files(f"{name}: the same checkpoint", p("rc_none.st"), p("rc.st"))
            if not offload:
                peaks[form.partition("=")[2] or "bare"] = memory(r.stdout)[0]
    check(f"peaks of device memory: none > every 3rd > every 2nd > full, ops < none: {peaks}",
          peaks["none"] > peaks["3"] > peaks["2"] > peaks["full"] > 0 and
          peaks["ops"] < peaks["none"] and peaks["bare"] == peaks["full"])
    for value in ("0", "-1", "x", ""):
        expect_error(f"--recompute={value}", TINY + [f"--recompute={value}"],
                     f"--recompute={value}: expected full, ops, auto or a layer interval N")
    for value in ("ops", "auto"):
        expect_error(f"a form given apart ({value})", TINY + ["--recompute", value],
                     f"--recompute takes its form after '=': --recompute={value}")
    expect_error("a layer interval beyond the layers", base + ["--recompute=6"],
                 "--recompute=6: no layer of the 5 would be recomputed")


def recompute_auto():
    """--recompute=auto: the first of none, ops, every 2nd layer and full whose activations fit
    what LLMCL_MEMORY_LIMIT leaves (its line gives each tried form's bytes and what is left); each
    pick trains to the bits of the run that keeps everything; with --offload none is not tried."""
    # many short rows of a narrow f32 model: activations MiBs apart between the forms, in seconds
    # on llvmpipe
    args = TINY + ["--layers", "5", "--batch", "32", "--seq", "32", "--dtype", "f32", "--steps", "2",
                   "--recompute=auto"]
    words = {"none": None, "ops": "selective activation checkpointing of ops",
             "2": "selective activation checkpointing of every 2nd layer",
             "full": "full activation checkpointing"}
    keep = expect_ok("auto: the run that keeps everything", args[:-1])

    def auto_run(what, limit_mib, extra=()):
        r = expect_ok(what, args + list(extra), env={"LLMCL_MEMORY_LIMIT": str(int(limit_mib * 2**20))})
        line = re.search(r"^activations by --recompute=auto: (.*), of ([\d.]+) MiB left$", r.stdout,
                         re.M)
        model = re.search(r"^model: .*$", r.stdout, re.M)
        check(f"{what}: the account and the model line", bool(line and model))
        if not (line and model):
            return [], 0.0, None, r
        needs = [(name, float(v)) for name, v in re.findall(r"(\w+) ([\d.]+) MiB", line.group(1))]
        picked = next((f for f, w in words.items() if w and w in model.group(0)), "none")
        return needs, float(line.group(2)), picked, r

    needs, left, picked, r = auto_run("auto within 381 MiB", 381.0)
    check(f"auto within 381 MiB: none fits and runs, the bits of keeping everything: {needs}",
          [n for n, _ in needs] == ["none"] and picked == "none" and needs[0][1] <= left and
          losses(r.stdout) == losses(keep.stdout) and len(losses(r.stdout)) == 2)
    base = 381.0 - left  # what the model's other buffers and a step's scratch take
    needs, left, picked, _ = auto_run("auto with 1 MiB left", base + 1.0)
    check(f"auto with 1 MiB left: every form tried, full taken: {needs}",
          [n for n, _ in needs] == ["none", "ops", "2", "full"] and picked == "full")
    need = dict(needs)
    for i, form in enumerate(["none", "ops", "2", "full"]):
        earlier = [need[f] for f in ["none", "ops", "2", "full"][:i]]
        if i == 0 or min(earlier) <= need[form] + 1.0:
            continue  # never first to fit, or too close to tell from the printed sizes
        what = f"auto with room for {form} alone"
        _, _, picked, r = auto_run(what, base + need[form] + 0.5)
        check(f"{what}: {picked} taken, the bits of keeping everything",
              picked == form and losses(r.stdout) == losses(keep.stdout))
    needs, _, picked, _ = auto_run("auto with --offload", 381.0, ["--offload"])
    check(f"auto with --offload: ops first: {needs}",
          needs[:1] and needs[0][0] == "ops" and picked == "ops")


def optimizer_in_backward(p):
    """--optimizer-in-backward: the losses, norms and checkpoint of the step after the backward,
    bit for bit, tied and untied, bf16, f16 and f32, with --recompute's forms and --offload, the
    fused cross-entropy and LoRA; a lower peak of device memory; checkpoints resumed across the flag
    both ways; the combinations it cannot serve refused in one line."""
    base = TINY + ["--layers", "3", "--min-lr", "1", "--clip", "0", "--steps", "4"]
    flag = ["--optimizer-in-backward"]
    for i, extra in enumerate(([], ["--untied"], ["--dtype", "f32"], ["--dtype", "f16", "--untied"],
                  ["--recompute=ops", "--offload"], ["--recompute=2"],
                  ["--untied", "--fused-ce", "--recompute", "--offload"], ["--lora", "4"],
                  ["--lora", "4", "--lora-targets", "q,v,down", "--untied"])):
        name = "--optimizer-in-backward" + "".join(" " + e for e in extra)
        after = expect_ok(name + " (without)", base + extra + ["--save", p(f"oib_after{i}.st")])
        r = expect_ok(name, base + extra + flag + ["--save", p(f"oib{i}.st")])
        check(f"{name}: the start-up line says so",
              "optimizer: AdamW on each layer group in the backward" in r.stdout)
        check(f"{name}: the same losses and norms",
              len(losses(r.stdout)) == 4 and losses(r.stdout) == losses(after.stdout))
        same_files(f"{name}: the same checkpoint", p(f"oib_after{i}.st"), p(f"oib{i}.st"))
        peak, base_peak = memory(r.stdout)[0], memory(after.stdout)[0]
        check(f"{name}: a lower peak ({peak} < {base_peak} MiB)", 0 < peak < base_peak)
    expect_ok("2 steps in the backward", base + flag + ["--steps", "2", "--save", p("oib_2.st")])
    expect_ok("resumed after the backward", base + ["--resume", p("oib_2.st"), "--save",
                                                     p("oib_r1.st")])
    same_files("resumed without the flag: the same checkpoint", p("oib0.st"), p("oib_r1.st"))
    expect_ok("2 steps after the backward", base + ["--steps", "2", "--save", p("oib_2a.st")])
    expect_ok("resumed in the backward", base + flag + ["--resume", p("oib_2a.st"), "--save",
                                                         p("oib_r2.st")])
    same_files("resumed with the flag: the same checkpoint", p("oib0.st"), p("oib_r2.st"))
    for what, extra, needle in (
            ("clipping", [], "cannot clip by their global norm: give --clip 0"),
            ("accumulation", ["--clip", "0", "--accum", "2"], "give --accum 1"),
            ("--zero", ["--clip", "0", "--zero", "1"], "--optimizer-in-backward and --zero do not"),
            ("--offload-optimizer", ["--clip", "0", "--offload-optimizer"],
             "--optimizer-in-backward and --offload-optimizer do not combine"),
            ("bf16 adapters", ["--clip", "0", "--lora", "4", "--lora-dtype", "bf16"],
             "--optimizer-in-backward needs f32 adapters")):
        expect_error(f"--optimizer-in-backward with {what}", TINY + flag + extra, needle)


def ce_logits(p):
    """--ce-logits bf16: the steps' logits rounded to the bf16 model's dtype train (finite,
    falling losses near the f32 logits' ones) to other bits than f32 logits; other dtypes, an f32
    model and --fused-ce are refused."""
    base = TINY + ["--steps", "4", "--min-lr", "1"]
    wide = expect_ok("f32 logits", base + ["--save", p("ce_f32.st")])
    half = expect_ok("--ce-logits bf16", base + ["--ce-logits", "bf16", "--save", p("ce_bf16.st")])
    a = [float(x.split()[1]) for x in losses(wide.stdout)]
    b = [float(x.split()[1]) for x in losses(half.stdout)]
    check(f"--ce-logits bf16: 4 losses, falling, within 1% of f32 logits': {a} {b}",
          len(a) == len(b) == 4 and b[-1] < b[0] and
          all(abs(x - y) <= 0.01 * abs(x) for x, y in zip(a, b)))
    check("--ce-logits bf16: other bits than f32 logits",
          open(p("ce_f32.st"), "rb").read() != open(p("ce_bf16.st"), "rb").read())
    model = re.search(r"^model: .*$", half.stdout, re.M)
    check("--ce-logits bf16: the start-up line says so, f32 logits' does not",
          model is not None and ", logits in bf16" in model.group(0) and
          "logits in" not in wide.stdout)
    needle = "--ce-logits takes f32, or the model's 16-bit dtype without --fused-ce"
    expect_error("--ce-logits f16 on a bf16 model", TINY + ["--ce-logits", "f16"], needle)
    expect_error("--ce-logits bf16 on an f32 model",
                 TINY + ["--dtype", "f32", "--ce-logits", "bf16"], needle)
    expect_error("--ce-logits bf16 with --fused-ce", TINY + ["--fused-ce", "--ce-logits", "bf16"],
                 needle)
    expect_error("--ce-logits int8", TINY + ["--ce-logits", "int8"],
                 "--ce-logits int8: expected bf16, f16 or f32")


def token_files(p):
    """A file named .bin, or one that starts like an llm.c header, is a whole llm.c file or
    refused; --data-format says how to read a file whose name misleads."""
    llmc_file(p("damaged.bin"), list(range(2000)), magic=20240521)
    expect_error("a .bin whose magic is damaged", TINY + ["--data", p("damaged.bin")],
                 "starts with 20240521, not an llm.c token file's magic")
    text = ("The cat sees the red ball. " * 200).encode()
    with open(p("text.bin"), "wb") as f:
        f.write(text)
    expect_error("a text file named .bin", TINY + ["--data", p("text.bin")],
                 "--data-format text")
    expect_ok("a text file named .bin with --data-format text",
              TINY + ["--data", p("text.bin"), "--data-format", "text", "--steps", "1"])
    with open(p("text.txt"), "wb") as f:
        f.write(text)
    expect_error("--data-format llmc on a text file", TINY + ["--data", p("text.txt"),
                                                             "--data-format", "llmc"],
                 "not an llm.c token file's magic")
    llmc_file(p("whole.bin"), list(range(2000)))
    with open(p("whole.bin"), "rb") as f:
        head = f.read(100)
    for name in ("partial.bin", "partial.txt"):  # by its name, and by its magic
        with open(p(name), "wb") as f:
            f.write(head)
        expect_error(f"a 100-byte partial header ({name})", TINY + ["--data", p(name)],
                     "100 bytes, shorter than the 1024-byte header of an llm.c token file")
    llmc_file(p("val.bin"), list(range(100)), count=200)
    expect_error("--val checked as --data is", TINY + ["--val", p("val.bin")],
                 "truncated or corrupt")
    expect_error("--data naming a folder", TINY + ["--data", p("")], "is a folder")
    expect_error("--val naming a folder", TINY + ["--val", p("")], "is a folder")
    expect_error("an unknown --data-format", TINY + ["--data-format", "csv"],
                 "expected auto, text, llmc or jsonl")
    shards(p)


def shards(p):
    """A pattern of llm.c shards trains as the one file that concatenates them (windows crossing
    their edges, a shard of one token among them); patterns that match nothing, mix formats or
    name a text file are refused."""
    tokens = [(7 * i + i * i) % 300 for i in range(3000)]
    os.mkdir(p("shards_data"))
    llmc_file(p("shards_data/all.bin"), tokens)
    for i, (a, b) in enumerate(((0, 1100), (1100, 1101), (1101, 3000))):
        llmc_file(p(f"shards_data/part_{i:03d}.bin"), tokens[a:b])
    args = TINY + ["--vocab", "300", "--steps", "4", "--eval-every", "2"]
    one = expect_ok("the concatenated file", args + ["--data", p("shards_data/all.bin")])
    many = expect_ok("its three shards by a pattern",
                     args + ["--data", p("shards_data/part_*.bin")])
    held = lambda out: re.findall(r"held-out loss \S+", out)
    check("the shards train as the file: the same losses and held-out losses",
          losses(one.stdout) == losses(many.stdout) and len(losses(one.stdout)) == 4 and
          held(one.stdout) == held(many.stdout) and len(held(one.stdout)) == 2)
    check("the data line names the pattern and its files",
          "part_*.bin (3 files), 2850 training and 150 held-out tokens" in many.stdout)
    capped = expect_ok("--eval-batches past the held-out data's 4 micro-batches",
                       args + ["--data", p("shards_data/all.bin"), "--eval-batches", "9"])
    check("an evaluation reads the held-out data once, however many batches are asked",
          "--eval-batches 9: the held-out data holds 4 micro-batches" in capped.stdout and
          held(capped.stdout) == held(one.stdout))
    expect_ok("--val as a pattern", args + ["--data", p("shards_data/all.bin"), "--val",
                                            p("shards_data/part_00[02].bin")])
    expect_error("a pattern that matches nothing", TINY + ["--data", p("shards_data/none_*.bin")],
                 "none_*.bin matches no file")
    llmc_file(p("shards_data/part_003.bin"), tokens[:100], magic=20240801, version=7, width="I")
    expect_error("shards of two formats", TINY + ["--data", p("shards_data/part_*.bin")],
                 "part_003.bin: magic 20240801 where")
    os.remove(p("shards_data/part_003.bin"))
    with open(p("shards_data/part_003.bin"), "w") as f:
        f.write("The cat sees the red ball. " * 100)
    expect_error("a text file among the shards", TINY + ["--data", p("shards_data/part_*.bin")],
                 "part_003.bin: starts with")
    expect_error("a pattern read as text", TINY + ["--data", p("shards_data/part_*.bin"),
                                                   "--data-format", "text"],
                 "a pattern names llm.c token files")
    llmc_file(p("shards_data/big_0.bin"), tokens)
    llmc_file(p("shards_data/big_1.bin"), [5, 400, 6] * 10)
    expect_error("a token beyond the vocabulary, by file and place",
                 TINY + ["--vocab", "300", "--data", p("shards_data/big_*.bin")],
                 "big_1.bin: token 1 is 400, outside the model's vocabulary of 300")


def sft_examples(n, seed):
    """Tokenized examples as (prompt, completion) token lists, vocabulary 64."""
    state, out = seed, []
    for _ in range(n):
        state = (state * 1103515245 + 12345) % 2**31
        lp, lc = 2 + state % 9, 1 + (state >> 8) % 12
        toks = [(state >> 4) % 56 + 3 + i * i % 5 for i in range(lp + lc)]
        out.append((toks[:lp], toks[lp:]))
    return out


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")


def numbers(out):
    """The progress lines' losses and norms as numbers."""
    return [tuple(float(x) for x in re.findall(r"[\d.]+", l)) for l in losses(out)]


def examples(p):
    """Tokenized examples (JSON Lines): labels, TRL's completion_mask, transformers'
    assistant_masks and attention_mask's padding say the same thing the same way; a step's loss is
    the mean over every target that learns (so accumulation changes nothing); a run resumes bit
    for bit; malformed lines are refused by line."""
    ex = sft_examples(120, 7)
    forms = {
        "labels": [{"input_ids": a + b, "labels": [-100] * len(a) + b} for a, b in ex],
        "completion_mask": [{"prompt": "x", "input_ids": a + b,
                             "completion_mask": [0] * len(a) + [1] * len(b)} for a, b in ex],
        "assistant_masks": [{"input_ids": a + b, "assistant_masks": [False] * len(a) +
                             [True] * len(b)} for a, b in ex],
        "attention_mask": [{"input_ids": [1, 2] + a + b, "attention_mask": [0, 0] + [1] *
                            (len(a) + len(b)), "labels": [5, 5] + [-100] * len(a) + b}
                           for a, b in ex],
    }
    args = TINY + ["--vocab", "64", "--seq", "32", "--steps", "4", "--eval-every", "2",
                   "--min-lr", "1"]
    runs = {}
    for name, rows in forms.items():
        write_jsonl(p(f"sft_{name}.jsonl"), rows)
        runs[name] = expect_ok(f"examples with {name}",
                               args + ["--data", p(f"sft_{name}.jsonl")]).stdout
    held = lambda out: re.findall(r"held-out loss \S+", out)
    base = runs["labels"]
    check("the four forms train alike: the same losses and held-out losses",
          all(losses(r) == losses(base) and held(r) == held(base) for r in runs.values()) and
          len(losses(base)) == 4 and len(held(base)) == 2)
    check("the examples line: counts, rows, fill", re.search(
        r"examples: 114 training and 6 held-out, packed best fit decreasing into \d+ rows of 32 "
        r"tokens "
        r"\([\d.]+% tokens, the rest padding\), each attending only to itself", base) is not None)
    # 6 held-out examples fill fewer than 4 micro-batches of 2 rows: an evaluation reads them once
    once = re.search(r"--eval-batches 4: the held-out data holds ([123]) micro-batches", base)
    check("the held-out examples' micro-batches, said once", once is not None)
    exact = expect_ok("--eval-batches as many as the held-out examples fill",
                      args + ["--data", p("sft_labels.jsonl"), "--eval-batches", once.group(1)]
                      if once else args)
    check("the same held-out losses as the default's, read once",
          held(exact.stdout) == held(base) and "--eval-batches" not in exact.stdout)
    # the loss is the mean over the step's targets that learn, whatever the micro-batches
    one = numbers(expect_ok("4 rows a micro-batch", args + ["--batch", "4", "--data",
                                                            p("sft_labels.jsonl")]).stdout)
    two = numbers(expect_ok("2 rows a micro-batch, 2 micro-batches",
                            args + ["--batch", "2", "--accum", "2", "--data",
                                    p("sft_labels.jsonl")]).stdout)
    check(f"accumulation: the same step losses and norms ({one} vs {two})",
          len(one) == 4 and len(two) == 4 and
          all(abs(a - b) <= 2e-4 * (1 + abs(a)) for x, y in zip(one, two) for a, b in zip(x, y)))
    fill = lambda out: float(re.search(r"into \d+ rows of \d+ tokens \(([\d.]+)% tokens", out)
                             .group(1))
    greedy = expect_ok("--packing greedy", args + ["--packing", "greedy", "--data",
                                                   p("sft_labels.jsonl")]).stdout
    check("greedy packing: in file order, fewer tokens a row than best fit decreasing",
          "packed in file order into" in greedy and fill(greedy) < fill(base) and
          losses(greedy) != losses(base))
    expect_error("an unknown --packing", TINY + ["--packing", "tight"], "expected bfd or greedy")
    full = [{"input_ids": a + b} for a, b in ex]
    write_jsonl(p("sft_full.jsonl"), full)
    diff = numbers(expect_ok("examples that learn every token",
                             args + ["--data", p("sft_full.jsonl")]).stdout)
    check("masks change the loss", numbers(base)[0] != diff[0])
    # resume: 3 + 3 steps end with the bits of 6
    flat = args + ["--data", p("sft_labels.jsonl"), "--eval-every", "0"]
    expect_ok("6 steps of examples", flat + ["--steps", "6", "--save", p("sft_6.st")])
    expect_ok("3 steps of examples", flat + ["--steps", "3", "--save", p("sft_3.st")])
    expect_ok("3 more from the checkpoint", flat + ["--steps", "6", "--resume", p("sft_3.st"),
                                                    "--save", p("sft_36.st")])
    same_files("examples resumed: the uninterrupted run's checkpoint", p("sft_6.st"),
               p("sft_36.st"))
    expect_ok("examples with --dump-logits", flat + ["--steps", "1", "--dump-logits",
                                                     p("sft_logits.st")])
    _, t = read_st(p("sft_logits.st"))
    check("--dump-logits of examples writes their positions",
          "position_ids" in t and t["position_ids"][1] == [2, 32])
    expect_ok("examples longer than --seq are cut", args + ["--seq", "8", "--data",
                                                            p("sft_labels.jsonl")])
    bad = {
        "not JSON": (["{\"input_ids\": [1, 2]}", "{\"input_ids\": [1, 2"], ":2: not valid JSON"),
        "not an object": (["[1, 2, 3]"], ":1: not a JSON object"),
        "no input_ids": ([{"text": "hello"}], ":1: no \"input_ids\" array"),
        "an empty example": ([{"input_ids": []}], ":1: the example has no tokens"),
        "labels of another length": ([{"input_ids": [1, 2, 3], "labels": [1, 2]}],
                                     "\"labels\" has 2 entries where input_ids has 3"),
        "a label of -5": ([{"input_ids": [1, 2, 3], "labels": [-100, -5, 3]}],
                          "labels[1] is -5; expected -100 or a value in [0, 2^31)"),
        "a negative token": ([{"input_ids": [1, -100, 3]}], "input_ids[1] is -100"),
        "a token that is text": ([{"input_ids": [1, "a"]}], "input_ids[1] is not an integer"),
        "a mask of 2": ([{"input_ids": [1, 2], "completion_mask": [0, 2]}],
                        "completion_mask[1] is 2; a mask holds 0 or 1"),
        "all padding": ([{"input_ids": [1, 2], "attention_mask": [0, 0]}],
                        "(its attention_mask is all 0)"),
        "a mask that is not an array": ([{"input_ids": [1, 2], "assistant_masks": 1}],
                                        "\"assistant_masks\" is not an array"),
        "a duplicate key": (['{"input_ids": [1, 2], "input_ids": [3]}'], ":1: not valid JSON"),
        "a token beyond the vocabulary": ([{"input_ids": [1, 70]}], "example 1 holds token 70, outside"),
        "a label beyond the vocabulary": ([{"input_ids": [1, 2, 3], "labels": [1, 2, 99]}],
                                          "example 1 learns 99, outside"),
        "blank lines only": (["", "  "], "holds no examples"),
        # a zero-filled stretch (a file cut short by a crash) is no blank line
        "a line of NUL bytes": (["{\"input_ids\": [1, 2]}", "\0" * 64], ":2: not valid JSON"),
    }
    for what, (rows, needle) in bad.items():
        write_jsonl(p("sft_bad.jsonl"), rows)
        expect_error(f"examples: {what}", TINY + ["--vocab", "64", "--data", p("sft_bad.jsonl")],
                     needle)
    # the vocabulary that the ids bound, from the largest id a file may hold (it overflowed)
    write_jsonl(p("sft_bad.jsonl"), [{"input_ids": [1, 2**31 - 1]}, {"input_ids": [2, 3]}])
    expect_error("examples: a token of 2^31 - 1 without --vocab", TINY + ["--data",
                                                                         p("sft_bad.jsonl")],
                 "holds token 2147483647, outside the model's vocabulary of 2147483647")
    write_jsonl(p("sft_one.jsonl"), [{"input_ids": [1, 2, 3]}])
    r = run(TINY + ["--vocab", "64", "--eval-every", "1", "--data", p("sft_one.jsonl")])
    check(f"one example: none held out, refused before the first step: {r.stderr.strip()[:120]}",
          r.returncode == 1 and "the held-out end of" in r.stderr and
          "no examples left for this split" in r.stderr and "step" not in r.stdout)
    expect_ok("one example with --val", TINY + ["--vocab", "64", "--steps", "1", "--data",
                                                p("sft_one.jsonl"), "--val", p("sft_one.jsonl")])
    expect_error("--data-format jsonl on a pattern", TINY + ["--data", p("sft_*.jsonl"),
                                                             "--data-format", "jsonl"],
                 "a pattern names llm.c token files")


def distill(p):
    """--teacher: a student that is its own teacher has a divergence of 0 (loss and norm 0 with
    --distill-alpha 1, in f32 and in bf16; half the cross-entropy's loss and norm with 0.5); a
    teacher trained apart teaches a falling loss, the same in two micro-batches as in one;
    --profile shows the teacher's forward; bad values and what distillation does not combine with
    are refused."""
    base = TINY + ["--dtype", "f32", "--lr", "0"]
    expect_ok("a teacher to distill from", TINY + ["--dtype", "f32", "--steps", "8",
                                                   "--export", p("teacher"),
                                                   "--export-dtype", "f32"])
    own = base + ["--init-from", p("teacher"), "--steps", "2"]
    r = expect_ok("a student that is its own teacher",
                  own + ["--teacher", p("teacher"), "--distill-alpha", "1"])
    check(f"its own teacher: the divergence is 0: {losses(r.stdout)}",
          losses(r.stdout) == ["loss 0.0000 | norm 0.000"] * 2 and "teacher: " in r.stdout)
    # in bf16 the teacher keeps no f32 masters: its bf16 copy rounds the file as the student's does
    own16 = [x for x in own if x not in ("--dtype", "f32")]
    r = expect_ok("a bf16 student that is its own teacher",
                  own16 + ["--teacher", p("teacher"), "--distill-alpha", "1"])
    check(f"its own bf16 teacher: the divergence is 0: {losses(r.stdout)}",
          losses(r.stdout) == ["loss 0.0000 | norm 0.000"] * 2 and ", bf16" in r.stdout)
    ce = [x.split() for x in losses(expect_ok("the cross-entropy alone", own).stdout)]
    half = [x.split() for x in losses(expect_ok("half distillation", own + [
        "--teacher", p("teacher"), "--distill-alpha", "0.5", "--distill-beta", "0.5",
        "--distill-temperature", "2"]).stdout)]
    check(f"half distillation from itself: half the loss and norm: {ce} {half}",
          len(ce) == len(half) == 2 and
          all(abs(float(a[1]) / 2 - float(b[1])) <= 1e-4 and
              abs(float(a[4]) / 2 - float(b[4])) <= 1e-3 for a, b in zip(ce, half)))
    r = expect_ok("a fresh student", TINY + ["--dtype", "f32", "--steps", "6", "--teacher",
                                             p("teacher"), "--distill-alpha", "1"])
    loss = [float(x.split()[1]) for x in losses(r.stdout)]
    check(f"a fresh student: 6 finite losses, falling: {loss}",
          len(loss) == 6 and all(0 < x < 10 for x in loss) and loss[-1] < loss[0])
    accum = [losses(expect_ok(what, TINY + ["--dtype", "f32", "--steps", "3", "--teacher",
                                            p("teacher")] + extra).stdout)
             for what, extra in (("a teacher, --accum 2", ["--accum", "2"]),
                                 ("a teacher, one micro-batch of 4", ["--batch", "4"]))]
    nums = [[[float(x.split()[1]), float(x.split()[4])] for x in run] for run in accum]
    check(f"a teacher: two micro-batches of 2 give one of 4's losses and norms: {accum}",
          len(nums[0]) == len(nums[1]) == 3 and
          all(abs(a - b) <= 2e-3 * abs(b) + 1e-3 for u, v in zip(*nums) for a, b in zip(u, v)))
    r = expect_ok("--profile with a teacher", TINY + ["--dtype", "f32", "--steps", "1",
                                                      "--teacher", p("teacher"), "--profile"])
    row, timed = profile_row(r.stdout, "teacher fwd")
    check(f"--profile times the teacher's forward as a row: {row}", timed)
    for what, extra, needle in (
            ("--distill-alpha without --teacher", ["--distill-alpha", "0.5"], "need --teacher"),
            ("--distill-alpha 0", ["--teacher", p("teacher"), "--distill-alpha", "0"],
             "leaves nothing to distill"),
            ("--distill-alpha 2", ["--teacher", p("teacher"), "--distill-alpha", "2"],
             "--distill-alpha must be in (0, 1]"),
            ("--distill-temperature 0", ["--teacher", p("teacher"),
                                         "--distill-temperature", "0"], "must be > 0"),
            ("--teacher with --fused-ce", ["--teacher", p("teacher"), "--fused-ce"],
             "not with --fused-ce"),
            ("--teacher with --ce-logits bf16",
             ["--dtype", "bf16", "--teacher", p("teacher"), "--ce-logits", "bf16"],
             "on f32 logits: not with --ce-logits bf16"),
            ("a teacher of another vocabulary", ["--teacher", p("teacher"), "--vocab", "300"],
             "the teacher's vocabulary has 256 tokens, the student's 300"),
            ("a teacher without config.json", ["--teacher", p("teacher/model.safetensors")],
             "config.json is needed")):
        expect_error(what, TINY + ["--dtype", "f32"] + extra, needle)


def pref_pairs(n, seed):
    """Tokenized preference pairs as TRL writes them (vocabulary 64): a chosen completion that
    counts on from the prompt's last token, a rejected one that steps from its first."""
    state, out = seed, []
    for _ in range(n):
        state = (state * 1103515245 + 12345) % 2**31
        lp, lc, lr = 2 + state % 6, 2 + (state >> 8) % 8, 2 + (state >> 12) % 8
        prompt = [(state >> 4) % 50 + 3 + i * i % 7 for i in range(lp)]
        out.append({"prompt": "text", "prompt_input_ids": prompt,
                    "chosen_input_ids": [(prompt[-1] + j + 1) % 50 + 3 for j in range(lc)],
                    "rejected_input_ids": [(prompt[0] * 7 + 5 * j) % 50 + 3 for j in range(lr)]})
    return out


def rewards(out):
    """The rewards lines' metrics by name, a list per step."""
    return [dict((k, float(v)) for k, v in re.findall(r"(rewards/\w+|logps/\w+) (\S+)", line))
            for line in re.findall(r"^step +\d+/\d+ \| rewards/.*$", out, re.M)]


def preference(p):
    """--preference: DPO against the starting model has margins of 0 at its first step, so a loss
    of log 2 and rewards of 0 (from the seeded weights, --init-from's, with LoRA, and the same
    model given as --ref, and a bf16 LoRA policy from --init-adapter against a copy with its
    adapters); a LoRA policy's own base as its reference gives --ref's bits; IPO's
    is 1 / (2 beta)^2; the loss falls on a tiny set; two micro-batches of one pair give one of
    two's losses and norms (ORPO's supervised term, a mean over the step's chosen tokens, too);
    a run resumes bit for bit; SimPO, CPO and ORPO train; --ce-logits bf16 rounds the policy's
    and the reference's logits alike; --profile times the reference's forward; bad values,
    combinations and lines are refused."""
    write_jsonl(p("pairs.jsonl"), pref_pairs(40, 5))
    write_jsonl(p("pairs8.jsonl"), pref_pairs(8, 5))
    # a given peak spares each run the rate's measurement
    base = TINY + ["--vocab", "64", "--dtype", "f32", "--peak-tflops", "1", "--data",
                   p("pairs.jsonl")]
    r = expect_ok("DPO from the seeded model", base + ["--preference", "dpo", "--steps", "3",
                                                       "--eval-every", "3", "--export",
                                                       p("pref_start"), "--export-dtype", "f32"])
    first = rewards(r.stdout)[0] if rewards(r.stdout) else {}
    check(f"DPO's first step against the starting model: loss log 2, rewards 0: "
          f"{losses(r.stdout)[:1]} {first}",
          losses(r.stdout)[0].startswith("loss 0.6931 |") and len(rewards(r.stdout)) == 3 and
          all(first[k] == 0 for k in ("rewards/chosen", "rewards/rejected",
                                      "rewards/accuracies", "rewards/margins")) and
          first["logps/chosen"] < 0)
    check("the pairs line, the preference line and the held-out loss with its rewards",
          "pairs: 38 training and 2 held-out; a micro-batch of 2 pairs is 4 rows of 16 tokens" in
          r.stdout and "preference: DPO, beta 0.1; logps summed over the completion; reference "
          "the starting model" in r.stdout and
          re.search(r"held-out loss [\d.]+ \| rewards/chosen \S+ \| rewards/rejected", r.stdout))
    for what, extra in (("--init-from's model", ["--init-from", p("pref_start")]),
                        ("a LoRA policy in bf16", ["--lora", "4", "--dtype", "bf16"]),
                        ("the starting model given as --ref", ["--init-from", p("pref_start"),
                                                               "--ref", p("pref_start")])):
        r = expect_ok(f"DPO, {what}", base + ["--preference", "dpo", "--steps", "1"] + extra)
        check(f"DPO, {what}: the first loss is log 2", losses(r.stdout)[:1] and
              losses(r.stdout)[0].startswith("loss 0.6931 |"))
    r = expect_ok("DPO against another --ref", base + ["--preference", "dpo", "--steps", "1",
                                                       "--ref", p("pref_start"), "--seed", "7"])
    check(f"another reference: margins that are not 0 ({losses(r.stdout)})",
          losses(r.stdout)[:1] and not losses(r.stdout)[0].startswith("loss 0.6931 |"))
    # a LoRA policy as its own reference (its base, adapters off) against that base loaded again
    # as --ref: the same bits; a learning rate that moves the rewards off 0 from the second step
    lo = base + ["--init-from", p("pref_start"), "--lora", "4", "--lr", "0.05", "--min-lr", "1",
                 "--steps", "3"]
    for loss_name, more in (("dpo", []),
                            ("ipo", ["--batch", "1", "--accum", "2", "--recompute"])):
        own, given = (expect_ok(f"{loss_name}, LoRA, {what}",
                                lo + ["--preference", loss_name, "--save",
                                      p(f"pref_self_{what}.st")] + more + extra)
                      for what, extra in (("own", []), ("ref", ["--ref", p("pref_start")])))
        check(f"{loss_name}, LoRA: its own base as the reference, or --ref's copy",
              "reference the starting model: the policy with its adapters off" in own.stdout and
              f"reference {p('pref_start')}, " in given.stdout and
              "adapters off" not in given.stdout)
        got = rewards(own.stdout)
        check(f"{loss_name}, LoRA, its own reference: --ref's losses and rewards, not 0: "
              f"{losses(own.stdout)} {got[-1:]}",
              losses(own.stdout) == losses(given.stdout) and len(got) == 3 and
              got == rewards(given.stdout) and got[-1]["rewards/margins"] != 0)
        same_files(f"{loss_name}, LoRA, its own reference: --ref's checkpoint",
                   p("pref_self_own.st"), p("pref_self_ref.st"))
    # adapters from a file are part of the starting model: a second copy, adapters and all (in
    # bf16, where the copy's adapters are its 16-bit values alone, as its base is)
    expect_ok("LoRA adapters to start from", lo + ["--preference", "dpo", "--export",
                                                   p("pref_adapter"), "--export-dtype", "f32"])
    r = expect_ok("DPO from --init-adapter", [x for x in base if x not in ("--dtype", "f32")] + [
        "--init-from", p("pref_start"), "--init-adapter", p("pref_adapter"), "--preference",
        "dpo", "--steps", "1"])
    check(f"DPO from --init-adapter: the starting model again as the reference, log 2: "
          f"{losses(r.stdout)}", losses(r.stdout)[:1] and
          losses(r.stdout)[0].startswith("loss 0.6931 |") and
          rewards(r.stdout)[:1] == [dict(rewards(r.stdout)[0], **{
              "rewards/chosen": 0, "rewards/rejected": 0, "rewards/margins": 0})] and
          "reference the starting model, " in r.stdout and "adapters off" not in r.stdout)
    # JSON Lines name no tokenizer: the ids bound the vocabulary, unless a Llama preset names
    # Llama 3's
    top = max(max(x[k]) for x in pref_pairs(40, 5)
              for k in ("prompt_input_ids", "chosen_input_ids", "rejected_input_ids"))
    for what, more, vocab in (("the tiny model", [], f"vocab {top + 1},"),
                              ("a Llama preset", ["--preset", "llama-1b"], "vocab 128256,")):
        r = expect_ok(f"pairs on {what}", more + TINY + [
            "--data", p("pairs.jsonl"), "--preference", "dpo", "--steps", "1", "--peak-tflops",
            "1", "--dtype", "f32"])
        check(f"pairs on {what}: {vocab}", vocab in r.stdout)
    r = expect_ok("IPO", base + ["--preference", "ipo", "--steps", "2", "--pref-beta", "0.25"])
    check(f"IPO's first loss is (1 / (2 beta))^2 = 4: {losses(r.stdout)}",
          losses(r.stdout)[:1] and losses(r.stdout)[0].startswith("loss 4.0000 |"))
    r = expect_ok("DPO on 8 pairs", base + ["--data", p("pairs8.jsonl"), "--preference", "dpo",
                                            "--batch", "4", "--steps", "6", "--warmup", "0",
                                            "--min-lr", "1"])
    loss, acc = numbers(r.stdout), [x["rewards/accuracies"] for x in rewards(r.stdout)]
    check(f"DPO on a tiny set: the loss falls, the chosen win: {[x[0] for x in loss]} {acc}",
          len(loss) == 6 and loss[-1][0] < loss[0][0] - 0.1 and acc[-1] == 1)
    for loss_name, extra in (("dpo", []), ("orpo", [])):
        runs = [numbers(expect_ok(f"{loss_name} {what}", base + [
            "--preference", loss_name, "--steps", "3"] + extra + more).stdout)
            for what, more in (("2 micro-batches of 1 pair", ["--batch", "1", "--accum", "2"]),
                               ("1 micro-batch of 2 pairs", ["--batch", "2"]))]
        check(f"{loss_name}: two micro-batches give one's losses and norms: {runs}",
              len(runs[0]) == len(runs[1]) == 3 and
              all(abs(a - b) <= 2e-3 * abs(b) + 1e-3 for x, y in zip(*runs)
                  for a, b in zip(x, y)))
    flat = base + ["--preference", "dpo", "--min-lr", "1"]
    expect_ok("4 steps of DPO", flat + ["--steps", "4", "--save", p("pref_4.st")])
    expect_ok("2 steps of DPO", flat + ["--steps", "2", "--save", p("pref_2.st")])
    expect_ok("2 more from the checkpoint", flat + ["--steps", "4", "--resume", p("pref_2.st"),
                                                    "--save", p("pref_22.st")])
    same_files("DPO resumed: the uninterrupted run's checkpoint", p("pref_4.st"),
               p("pref_22.st"))
    for loss_name, line in (("simpo", "preference: SimPO, beta 0.1, gamma 0.5; logps averaged"),
                            ("cpo", "preference: CPO, beta 0.1, the chosen completions' "
                                    "cross-entropy at weight 1; logps summed"),
                            ("orpo", "preference: ORPO, beta 0.1, the chosen completions' "
                                     "cross-entropy at weight 1; logps averaged")):
        r = expect_ok(loss_name, base + ["--preference", loss_name, "--steps", "3"])
        loss = [x[0] for x in numbers(r.stdout)]
        check(f"{loss_name}: its line, 3 finite losses and rewards: {loss}",
              line in r.stdout and "; reference" not in r.stdout and len(loss) == 3 and
              all(0 < x < 20 for x in loss) and len(rewards(r.stdout)) == 3)
    half = base[:base.index("--dtype")] + base[base.index("--dtype") + 2:] + [
        "--preference", "dpo", "--steps", "3", "--min-lr", "1"]
    runs = [expect_ok(f"DPO in bf16, {what} logits",
                      half + more + ["--save", p(f"pref_{what}.st")])
            for what, more in (("f32", []), ("bf16", ["--ce-logits", "bf16"]))]
    loss = [[x[0] for x in numbers(r.stdout)] for r in runs]
    check(f"DPO with --ce-logits bf16 (the reference's logps rounded alike): a first loss of "
          f"log 2, then near f32 logits': {loss}",
          losses(runs[1].stdout)[:1] and losses(runs[1].stdout)[0].startswith("loss 0.6931 |")
          and len(loss[0]) == len(loss[1]) == 3 and
          all(abs(a - b) <= 0.02 * abs(a) for a, b in zip(*loss)) and
          ", logits in bf16" in runs[1].stdout)
    check("DPO with --ce-logits bf16: other bits than f32 logits",
          open(p("pref_f32.st"), "rb").read() != open(p("pref_bf16.st"), "rb").read())
    for what, extra in (("a reference", []), ("LoRA's own reference", ["--lora", "4"])):
        r = expect_ok(f"--profile with {what}", base + ["--preference", "dpo", "--steps", "1",
                                                        "--profile"] + extra)
        row, timed = profile_row(r.stdout, "reference fwd")
        check(f"--profile with {what} times its forward as a row: {row}", timed)
    dpo = ["--preference", "dpo", "--data", p("pairs.jsonl")]
    for what, extra, needle in (
            ("--preference without --data", ["--preference", "dpo"], "give --data FILE.jsonl"),
            ("an unknown --preference", ["--preference", "kto"],
             "expected dpo, ipo, simpo, cpo or orpo"),
            ("--ref without --preference", ["--ref", p("pref_start")], "need --preference"),
            ("--pref-beta without --preference", ["--pref-beta", "0.2"], "need --preference"),
            ("--preference with --teacher", dpo + ["--teacher", p("pref_start")],
             "--preference and --teacher do not combine"),
            ("--preference with --fused-ce", dpo + ["--fused-ce"], "leave out --fused-ce"),
            ("--preference with --packing", dpo + ["--packing", "greedy"],
             "each sequence of a pair has a row of its own"),
            ("--preference on text", dpo + ["--data-format", "text"],
             "not --data-format text"),
            ("--preference on examples", ["--preference", "dpo", "--data",
                                          p("sft_labels.jsonl")],
             "sft_labels.jsonl:1: an example (input_ids), not a preference pair"),
            ("pairs without --preference", ["--data", p("pairs.jsonl")],
             "pairs.jsonl:1: a preference pair (chosen_input_ids), not an example"),
            ("--ref for SimPO", ["--preference", "simpo", "--data", p("pairs.jsonl"), "--ref",
                                 p("pref_start")], "--preference simpo takes no reference"),
            ("--pref-gamma for DPO", dpo + ["--pref-gamma", "1"], "SimPO's target margin"),
            ("--pref-label-smoothing for IPO", ["--preference", "ipo", "--data",
                                                p("pairs.jsonl"), "--pref-label-smoothing",
                                                "0.1"], "--preference ipo takes none"),
            ("--pref-label-smoothing 0.6", dpo + ["--pref-label-smoothing", "0.6"],
             "must be in [0, 0.5]"),
            ("--pref-beta 0", dpo + ["--pref-beta", "0"], "--pref-beta must be > 0"),
            ("a --ref of another vocabulary", dpo + ["--ref", p("teacher")],
             "the reference model's vocabulary has 256 tokens, the policy's 64"),
            # a completion cut whole by --seq: ORPO's loss would be inf or NaN
            ("ORPO with completions past --seq", ["--preference", "orpo", "--data",
                                                  p("pairs.jsonl"), "--seq", "4"],
             "which makes ORPO's odds infinite: raise --seq")):
        expect_error(what, TINY + ["--vocab", "64"] + extra, needle)
    good = {"prompt_input_ids": [3, 4], "chosen_input_ids": [5], "rejected_input_ids": [6]}
    bad = {
        "no chosen_input_ids": ([{"prompt_input_ids": [3], "rejected_input_ids": [6]}],
                                ":1: no \"chosen_input_ids\" array"),
        "an empty rejected completion": ([good, dict(good, rejected_input_ids=[])],
                                         ":2: \"rejected_input_ids\" is empty"),
        "a negative prompt token": ([dict(good, prompt_input_ids=[3, -1])],
                                    "prompt_input_ids[1] is -1"),
        "not an object": (["[1, 2]"], ":1: not a JSON object (each line holds one preference"),
        "a token beyond the vocabulary": ([good, dict(good, rejected_input_ids=[70])],
                                          "pair 2's rejected sequence holds token 70, outside"),
        "blank lines only": (["", " "], "holds no preference pairs"),
    }
    for what, (rows, needle) in bad.items():
        write_jsonl(p("pairs_bad.jsonl"), rows)
        expect_error(f"pairs: {what}", TINY + ["--vocab", "64", "--preference", "dpo", "--data",
                                              p("pairs_bad.jsonl")], needle)


def start_up(p):
    """Output paths, options and sizes refused before the first step, naming what to change."""
    cases = [("--save in a missing folder", ["--save", p("none/ck.st")],
              f"--save {p('none/ck.st')}: cannot write there: {p('none')}: No such file"),
             ("--save naming a folder", ["--save", os.path.dirname(p("x"))], "is a folder"),
             ("--save ending in /", ["--save", p("new/")], "names a folder"),
             ("--export naming a file", ["--export", p("text.txt")], "exists and is not a folder"),
             ("--export in a missing folder", ["--export", p("none/e")], "No such file"),
             ("--dump-logits in a missing folder", ["--dump-logits", p("none/l.st")],
              "No such file"),
             ("--resume of a missing file", ["--resume", p("none.st")],
              f"--resume {p('none.st')}: No such file or directory"),
             ("--save under --zero naming a file", ["--zero", "1", "--save", p("text.txt")],
              "exists and is not a folder"),
             ("--save under --zero naming a folder of other files",
              ["--zero", "1", "--save", os.path.dirname(p("x"))],
              "holds files but no manifest.json: it is no checkpoint folder"),
             # outputs that would overwrite each other, or the checkpoint resumed
             ("--save and --dump-logits of one file",
              ["--save", p("one.st"), "--dump-logits", p("./one.st")],
              "--save and --dump-logits both name"),
             ("--dump-logits over --resume's checkpoint",
              ["--resume", p("text.txt"), "--dump-logits", p("text.txt")],
              "--dump-logits and --resume both name"),
             # options that shape what the run does not do
             ("--lora-alpha without LoRA", ["--lora-alpha", "32"], "give --lora R"),
             ("--lora-targets without LoRA", ["--lora-targets", "q"], "give --lora R"),
             ("--lora-dtype without LoRA", ["--lora-dtype", "bf16"], "give --lora R"),
             ("--export-dtype without --export", ["--export-dtype", "f32"], "give --export DIR"),
             ("--export-shard-gb without --export", ["--export-shard-gb", "1"],
              "give --export DIR"),
             ("--packing on a stream of tokens", ["--packing", "greedy"],
              "--packing packs the examples of a JSON Lines file"),
             ("--min-lr above 1", ["--min-lr", "5"], "--min-lr 5: expected a number in [0, 1]"),
             ("--lr beyond a float", ["--lr", "1e39"], "--lr 1e39: expected a number >= 0"),
             ("--preset=NAME of no preset", ["--preset=bogus"], "unknown --preset bogus"),
             # held-out data too short for a batch: found at the start, not at the first
             # evaluation after the training (600 bytes hold 30 held-out tokens, 33 needed)
             ("held-out data shorter than a batch",
              ["--data", p("six_hundred.txt"), "--eval-every", "1"],
              "the held-out end of " + p("six_hundred.txt") + " holds 30 tokens")]
    with open(p("six_hundred.txt"), "w") as f:
        f.write("abcdefghij" * 60)
    for what, args, needle in cases:
        r = run(TINY + ["--steps", "1"] + args)
        ok = r.returncode == 1 and needle in r.stderr and "step" not in r.stdout
        check(f"{what}: refused before training: {r.stderr.strip()[:150]}", ok)
    for what, args, needle in (("an unknown option", ["--frobnicate"],
                                "llmcl-train: unknown option '--frobnicate' (see --help)"),
                               ("an option without its value", ["--data"],
                                "llmcl-train: --data needs a value (see --help)")):
        r = run(TINY + args)
        check(f"{what}: one line, status 2: {r.stderr.strip()[:100]}",
              r.returncode == 2 and r.stderr.strip() == needle)
    # a parameter buffer beyond any device's largest allocation (2^44 elements)
    expect_error("a model beyond the largest allocation",
                 ["--vocab", "16777216", "--dim", "1048576", "--heads", "4096", "--kv-heads",
                  "4096", "--layers", "1", "--ffn", "64", "--batch", "1", "--seq", "8"],
                 "cannot allocate the trainable parameters' bf16 weights: 21990437027840 bf16 "
                 "elements, 40960.38 GiB in one buffer, beyond this device's largest allocation")
    env = dict(os.environ, LLMCL_MEMORY_LIMIT="8M")
    r = subprocess.run([TRAIN] + TINY + ["--batch", "64", "--seq", "64"], capture_output=True,
                       text=True, timeout=300, env=env)
    check(f"activations beyond the memory: {r.stderr.strip()[:200]}",
          r.returncode == 1 and "cannot allocate an activation buffer" in r.stderr and
          "(LLMCL_MEMORY_LIMIT) are in use: shorten --batch or --seq" in r.stderr and
          "--recompute=auto takes the first form that fits" in r.stderr)


def first_run(p):
    """What the output says around the steps."""
    r = expect_ok("3 steps, nothing saved", TINY + ["--steps", "3"])
    lines = re.findall(r"^step +\d+/3 \|.*$", r.stdout, re.M)
    check("the first step's line: its time, no speed or ETA; the others: both",
          len(lines) == 3 and "first step" in lines[0] and "ETA" not in lines[0] and
          "tok/s" not in lines[0] and all("ETA" in l and "tok/s" in l for l in lines[1:]))
    # a measured peak is a believable rate (not 0.0, nor rusticl's timer's 67108.9 TFLOP/s), or
    # is not given and the progress lines go without MFU
    peak = re.search(r"peak ([\d.]+) ([TG])FLOP/s \(measured [^)]*\)", r.stdout)
    tflops = float(peak.group(1)) * (1 if peak.group(2) == "T" else 1e-3) if peak else 0
    unmeasured = "peak not measured: " in r.stdout and "MFU" not in "".join(lines)
    check(f"a believable peak or none: {r.stdout.splitlines()[0][:200]}",
          0 < tflops < 5000 if peak else unmeasured)
    check("a run that kept nothing says so and what to try",
          "nothing was saved" in r.stdout and "--save FILE" in r.stdout and
          "--export DIR" in r.stdout and "--data FILE" in r.stdout and "--help" in r.stdout)
    r = expect_ok("--peak-tflops 0.25", TINY + ["--steps", "1", "--peak-tflops", "0.25",
                                                "--save", p("first.st")])
    check("a given peak below 1 TFLOP/s in GFLOP/s", "peak 250 GFLOP/s (given)" in r.stdout)
    check("a run that saved gives no hint", "nothing was saved" not in r.stdout)
    r = expect_ok("--profile", TINY + ["--steps", "2", "--profile"])
    span = re.search(r"^one step without waits: ([\d.]+) ms of kernels \((\d+) launches\) in a "
                     r"span of ([\d.]+) ms, no kernel running for (-?[\d.]+) ms of it", r.stdout, re.M)
    untimed = UNTIMED.search(r.stdout)
    check("--profile: the step by op family, then one without waits and its span (or, where the "
          "events do not time kernels, no profile)",
          untimed is not None and "profile of one step" not in r.stdout if span is None else
          "profile of one step" in r.stdout and "matmul y=xW^T" in r.stdout and
          int(span.group(2)) > 0 and float(span.group(3)) > 0 and
          abs(float(span.group(3)) - float(span.group(1)) - float(span.group(4))) < 0.11)


def main():
    tmp = tempfile.mkdtemp(prefix="llmcl-train-cli.")
    p = lambda name: os.path.join(tmp, name)
    expect_error("heads that do not divide the width", TINY + ["--heads", "3"],
                 "3 heads do not divide the width 64")
    expect_error("kv heads that do not divide the heads", TINY + ["--kv-heads", "3"],
                 "3 key/value heads do not divide the 2 query heads")
    expect_error("head dimension out of range", TINY + ["--heads", "16"],
                 "head dimension 4 (width 64 / 16 heads) must be a multiple of 8 from 8 to 256")
    for heads in (4, 8):  # the head dims 16 and 8 of tiny test models train
        r = expect_ok(f"head dimension {64 // heads}",
                      TINY + ["--heads", str(heads), "--kv-heads", "2", "--steps", "4"])
        loss = [float(x.split()[1]) for x in losses(r.stdout)]
        check(f"head dimension {64 // heads}: 4 finite losses, falling",
              len(loss) == 4 and all(x == x and x < 10 for x in loss) and loss[-1] < loss[0])
    # the llama-8b preset's depth: the forward's views of every layer once overflowed model.c's
    # arena ("model: too many views in one call" from 23 layers on)
    expect_ok("a model of 32 layers", TINY + ["--layers", "32", "--steps", "1"])
    # the Llama presets' learning rate (Llama 3's), on a model shrunk by the flags after them
    small = TINY + ["--vocab", "256", "--steps", "1"]
    for preset, extra, lr in (("llama-1b", [], "3.00e-04"), ("llama-8b", [], "3.00e-04"),
                              ("llama-8b", ["--lr", "1e-3"], "1.00e-03"), ("tiny", [], "3.00e-03")):
        r = expect_ok(f"--preset {preset} {' '.join(extra)}", ["--preset", preset] + small + extra)
        check(f"--preset {preset} {' '.join(extra)}: lr {lr}", f"| lr {lr} |" in r.stdout)
    for spelled in (["--preset=llama-1b"], ["--pres", "llama-1b"]):  # as getopt_long takes them
        r = expect_ok(" ".join(spelled), spelled + small)
        check(f"{' '.join(spelled)}: the preset's lr", "| lr 3.00e-04 |" in r.stdout)
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
    expect_error("offload without recompute", TINY + ["--offload"], "give both")
    token_files(p)
    examples(p)
    ce_logits(p)
    distill(p)
    preference(p)
    start_up(p)
    first_run(p)

    # resuming: 3 + 3 steps end with the bits of 6 uninterrupted ones (the file's whole bytes);
    # a constant learning rate (--min-lr 1) makes a 3-step run the first half of a 6-step one
    flat = TINY + ["--min-lr", "1"]
    straight = expect_ok("6 steps", flat + ["--steps", "6", "--save", p("straight.st")])
    expect_ok("3 steps", flat + ["--steps", "3", "--save", p("half.st")])
    r = expect_ok("resume for 3 more", flat + ["--steps", "6", "--resume", p("half.st"),
                                                "--save", p("resumed.st")])
    same = open(p("straight.st"), "rb").read() == open(p("resumed.st"), "rb").read()
    differs = open(p("straight.st"), "rb").read() != open(p("half.st"), "rb").read()
    print(f"{'ok  ' if same else 'FAIL'} resumed checkpoint identical to the uninterrupted one")
    if not same or not differs or "at step 3" not in r.stdout:
        failures.append("resume")
    expect_error("a checkpoint of another shape", TINY + ["--ffn", "128", "--resume",
                                                          p("straight.st")], "another shape")
    with open(p("straight.st"), "rb") as f:
        data = f.read()
    with open(p("cut.st"), "wb") as f:
        f.write(data[: len(data) // 2])
    expect_error("a truncated checkpoint", TINY + ["--resume", p("cut.st")], "cannot resume")
    # found by tests/fuzz/fuzz_checkpoint: a step or data position with trailing garbage ("3x")
    # resumed at step 3 instead of being refused
    meta, tensors = read_st(p("half.st"))
    for key, value, needle in (("step", "3x", "lacks its step or data position"),
                               ("data_pos", "", "lacks its step or data position"),
                               ("step", "4294967297", "at step 4294967297, beyond any run's"),
                               ("data_pos", str(2**63 - 1), "lies beyond the training data")):
        write_st(p("garbled.st"), tensors, dict(meta, **{key: value}))
        expect_error(f"a checkpoint whose {key} is '{value}'", flat + ["--resume", p("garbled.st")],
                     needle)
    offload_optimizer(p, flat, straight)
    recompute_forms(p)
    recompute_auto()
    optimizer_in_backward(p)

    # Ctrl-C with --save-on-interrupt, pressed once and twice (the handler stays: System V's
    # signal() dropped it after the first, and the second killed the run before its save)
    # A model whose steps take about a second on two cores under PoCL (70 s under rusticl's
    # llvmpipe), so that the second press, 0.2 s after the first (two at once merge into one
    # signal), lands while a step still runs
    slow = TINY + ["--dim", "256", "--heads", "4", "--kv-heads", "2", "--ffn", "512", "--layers",
                   "4", "--batch", "8", "--seq", "128"]
    for presses in (1, 2):
        proc = subprocess.Popen([TRAIN] + slow + ["--steps", "1000000", "--save", p("int.st"),
                                                  "--save-on-interrupt"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while True:
            line = proc.stdout.readline()
            if not line or line.startswith("step"):
                break
        # the run stops after the step under way, which takes as long as the first at most (its
        # kernels built): 130 s on rusticl's llvmpipe, where a fixed 120 s ran out
        first = re.search(r"first step ([0-9.]+) s", line)
        for press in range(presses):
            time.sleep(0.2 if press else 0)
            proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=120 + 2 * (float(first[1]) if first else 0))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        ok = proc.returncode == 130 and os.path.exists(p("int.st")) and "interrupted" in out
        check(f"Ctrl-C pressed {presses}x saves and exits 130: status {proc.returncode}", ok)
        if os.path.exists(p("int.st")):
            os.remove(p("int.st"))
    # --save-every that divides --steps: the last step saved once
    r = expect_ok("--save-every 2 of 4 steps", TINY + ["--steps", "4", "--save", p("every.st"),
                                                        "--save-every", "2"])
    check("--save-every: the last step saved once",
          r.stdout.count("at step 4") == 1 and r.stdout.count("at step 2") == 1)
    # a given --warmup stands, even as long as the run (the default's 20 becomes a tenth of a
    # shorter run)
    r = expect_ok("--warmup 4 of 4 steps", TINY + ["--steps", "4", "--warmup", "4"])
    check(f"--warmup 4: the first step's lr a quarter of 3e-3: {losses(r.stdout)[:1]}",
          "| lr 7.50e-04 |" in r.stdout)
    # the sample comes from the model the run ends with, before --profile's steps train on
    plain, profiled = (expect_ok(f"a sample{what}", TINY + ["--steps", "3", "--sample", "24"] +
                                 extra).stdout for what, extra in (("", []),
                                                                   (" with --profile",
                                                                    ["--profile"])))
    sample_of = lambda out: out[out.find("sample (greedy"):].splitlines()[:2]
    check("--profile leaves the sample as it was", sample_of(plain) == sample_of(profiled) and
          len(sample_of(plain)) == 2)

    hugging_face(p)
    failed_export(p)
    architectures(p)
    lora(p)
    peft_adapter(p)
    shutil.rmtree(tmp)
    if failures:
        print("failed:", ", ".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
