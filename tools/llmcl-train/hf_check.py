#!/usr/bin/env python3
"""hf_check.py: llmcl-train's Hugging Face interop checked against transformers (device only).

    make DIR      a random small LlamaForCausalLM (or with --arch a MistralForCausalLM,
                  Qwen2ForCausalLM or Qwen3ForCausalLM) saved with save_pretrained into DIR, a
                  token file DIR/tokens.bin (llm.c's format) for llmcl-train's --data/--val, and
                  the loss transformers computes on its first batch: what `llmcl-train
                  --init-from DIR --data DIR/tokens.bin --val DIR/tokens.bin` must print as its
                  first step's loss (the first training and held-out windows are both the file's
                  first B x T tokens). With --examples N, also DIR/examples.jsonl: N tokenized
                  examples of random lengths whose prompts learn nothing (labels -100), for
                  --data and --val as llmcl-train packs them. With --pairs N, also
                  DIR/pairs.jsonl: N tokenized preference pairs of random lengths (some longer
                  than --seq), for --preference.
    adapter DIR OUT
                  a PEFT LoRA adapter of DIR's model made by PEFT itself (LoraConfig with
                  init_lora_weights=False: A and B random, so that the adapter moves the logits),
                  saved with save_pretrained into OUT, for `llmcl-train --init-from DIR
                  --init-adapter OUT`, whose --dump-logits `logits DIR DUMP --adapter OUT` checks.
    logits DIR DUMP
                  loads DIR with AutoModelForCausalLM.from_pretrained (an --export folder, or a base
                  model plus, with --adapter, an adapter folder loaded by PEFT), runs the tokens
                  of llmcl-train's --dump-logits file DUMP and prints the largest logit difference,
                  relative to the largest logit, and both losses; fails above --tol. A dump of
                  packed examples (with position_ids) runs each example alone, as transformers
                  sees one example, and compares it with its rows of the packed batch.
    distill DIR TEACHER
                  the loss of `llmcl-train --init-from DIR --teacher TEACHER --data
                  DIR/tokens.bin` on its first batch, (1 - A) CE + A T^2 D with D the mean over
                  the targets of the generalised Jensen-Shannon divergence at --beta, and the
                  student's gradient norm, both by transformers and autograd; with --got
                  "LOSS NORM" (the step's line) fails where either differs by more than --tol
                  relative.
    preference DIR PAIRS
                  the first step's loss and gradient norm of `llmcl-train --init-from DIR --data
                  PAIRS --preference LOSS` (full fine-tuning), by transformers and autograd as
                  llmcl-train computes them: the step's --batch x --accum x --ranks pairs, the
                  first of the training split (the last 5% held out), each sequence the prompt
                  + a completion cut to --seq or padded at its end, only the completion scored;
                  the reference (DPO, IPO) --ref or DIR itself; the loss the mean of the pairs'
                  terms plus --nll-weight x the mean cross-entropy over the step's chosen
                  completion tokens. With --got "LOSS NORM" fails where either differs by more
                  than --tol relative; also prints TRL's rewards of the step.

transformers runs in float32 with eager attention and TF32 off, so the difference is llmcl's own
rounding: about 1e-5 of the largest logit with --dtype f32, about 1e-2 with bf16 compute.
docs/PORTABILITY.md lists the commands. Needs PyTorch and transformers; never a dependency of
the library or of CI.
"""
import argparse
import json
import math
import struct
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM


def first_batch(tokens, batch, seq):
    """llmcl-train's first window: B rows of T inputs, each target the next token of the file."""
    t = torch.tensor(tokens[: batch * seq + 1], dtype=torch.long)
    return t[:-1].view(batch, seq), t[1:].view(batch, seq)


def loss_of(model, ids, targets, positions=None):
    """The logits and the mean loss over the targets that learn (not -100); with positions (packed
    examples), each run where its positions start at 0 goes through the model alone."""
    with torch.no_grad():
        if positions is None:
            logits = model(input_ids=ids).logits.float()
        else:
            logits = torch.empty(*ids.shape, model.config.vocab_size)
            for b in range(ids.shape[0]):
                starts = (positions[b] == 0).nonzero().flatten().tolist() + [ids.shape[1]]
                for s, e in zip(starts, starts[1:]):
                    logits[b, s:e] = model(input_ids=ids[b:b + 1, s:e]).logits.float()[0]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             targets.reshape(-1))
    return logits, loss.item()


def write_examples(path, n, vocab, seq, seed):
    """n examples of 2 to seq tokens, a prompt learning nothing and a completion."""
    gen = torch.Generator().manual_seed(seed)
    with open(path, "w") as f:
        for _ in range(n):
            length = int(torch.randint(2, seq + 1, (1,), generator=gen))
            prompt = int(torch.randint(1, length, (1,), generator=gen))
            ids = torch.randint(0, vocab, (length,), generator=gen).tolist()
            f.write(json.dumps({"input_ids": ids,
                                "labels": [-100] * prompt + ids[prompt:]}) + "\n")


def arch_keys(args):
    """What --arch, --head-dim, --window and --attention-bias say, as the config class's keys."""
    keys = {}
    if args.head_dim:
        keys["head_dim"] = args.head_dim
    if args.arch == "llama":
        keys.update(rope_theta=500000.0, attention_bias=args.attention_bias,
                    rope_scaling={"rope_type": "llama3", "factor": 32.0,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 8192})
    elif args.arch == "mistral":
        keys.update(rope_theta=1e6, sliding_window=args.window or None)
    else:  # Qwen2 and Qwen3: a window on every layer, or on none
        keys.update(rope_theta=1e6, use_sliding_window=bool(args.window),
                    sliding_window=args.window or None,
                    max_window_layers=0 if args.window else args.layers)
        if args.arch == "qwen3":
            keys["attention_bias"] = args.attention_bias
    return keys


def make(args):
    torch.manual_seed(args.seed)
    cfg = AutoConfig.for_model(args.arch, vocab_size=args.vocab, hidden_size=args.dim,
                               intermediate_size=args.ffn, num_hidden_layers=args.layers,
                               num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                               max_position_embeddings=131072, rms_norm_eps=1e-5,
                               tie_word_embeddings=not args.untied, initializer_range=0.06,
                               attn_implementation="eager", **arch_keys(args))
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # norms away from 1 and biases from 0, so that they matter
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    model.to(getattr(torch, args.save_dtype)).save_pretrained(args.dir, safe_serialization=True)
    model.float()  # the weights as saved, rounded where bfloat16
    gen = torch.Generator().manual_seed(args.seed + 1)
    n = args.batch * args.seq * 4 + 1
    tokens = torch.randint(0, args.vocab, (n,), generator=gen).tolist()
    with open(f"{args.dir}/tokens.bin", "wb") as f:  # llm.c: magic, version 1 (uint16), count
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *tokens))
    if args.examples:
        write_examples(f"{args.dir}/examples.jsonl", args.examples, args.vocab, args.seq,
                       args.seed + 2)
    if args.pairs:
        write_pairs(f"{args.dir}/pairs.jsonl", args.pairs, args.vocab, args.seq, args.seed + 3)
    ids, targets = first_batch(tokens, args.batch, args.seq)
    _, loss = loss_of(model, ids, targets)
    print(f"{args.dir}: {type(model).__name__}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
          f"{args.save_dtype}; tokens.bin holds {n} tokens"
          f"{f', examples.jsonl {args.examples} examples' if args.examples else ''}"
          f"{f', pairs.jsonl {args.pairs} pairs' if args.pairs else ''}")
    print(f"transformers loss of the first {args.batch} x {args.seq} batch: {loss:.6f} "
          f"(ln V = {math.log(args.vocab):.4f})")


def adapter(args):
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(args.dir, torch_dtype=getattr(torch, args.dtype))
    targets = args.targets if args.targets == "all-linear" else args.targets.split(",")
    config = LoraConfig(r=args.r, lora_alpha=args.alpha, target_modules=targets,
                        use_rslora=args.rslora, lora_dropout=0.0, init_lora_weights=False,
                        task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    peft_model.save_pretrained(args.out)
    saved = json.load(open(f"{args.out}/adapter_config.json"))
    print(f"{args.out}: PEFT adapter, r {saved['r']}, lora_alpha {saved['lora_alpha']}, "
          f"use_rslora {saved['use_rslora']}, targets {sorted(saved['target_modules'])}, "
          f"{sum(p.numel() for n, p in peft_model.named_parameters() if 'lora_' in n)} "
          f"parameters in {args.dtype}")


def logits(args):
    dump = load_file(args.dump)
    ids, targets = dump["input_ids"].long(), dump["targets"].long()
    positions = dump["position_ids"].long() if "position_ids" in dump else None
    with open(args.dump, "rb") as f:  # the loss is in the file's metadata
        n = struct.unpack("<Q", f.read(8))[0]
        llmcl_loss = float(json.loads(f.read(n))["__metadata__"]["loss"])
    model = AutoModelForCausalLM.from_pretrained(args.dir, torch_dtype=torch.float32,
                                                 attn_implementation="eager")
    if args.adapter:
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, args.adapter)
    model.eval()
    got, loss = loss_of(model, ids, targets, positions)
    ref = dump["logits"].float()
    diff = (got - ref).abs().max().item()
    scale = ref.abs().max().item()
    ok = diff <= args.tol * scale
    if positions is not None:
        print(f"packed examples: {int((positions == 0).sum())} documents in {ids.shape[0]} rows, "
              f"each run alone by transformers")
    print(f"logits {list(ref.shape)}: max |transformers - llmcl| = {diff:.3e}, max |logit| = "
          f"{scale:.3f}, relative {diff / scale:.3e} (tolerance {args.tol:g}): "
          f"{'PASS' if ok else 'FAIL'}")
    print(f"loss: transformers {loss:.6f}, llmcl-train {llmcl_loss:.6f}, "
          f"difference {abs(loss - llmcl_loss):.3e}")
    return 0 if ok else 1


def divergence(student, teacher, beta, tau):
    """Per token: beta 0 KL(teacher || student), 1 KL(student || teacher), between the
    generalised JSD beta KL(teacher || M) + (1 - beta) KL(student || M), M = beta P + (1 - beta)
    Q, of the two distributions at temperature tau."""
    x = torch.log_softmax(student / tau, -1)
    y = torch.log_softmax(teacher / tau, -1)
    kl = torch.nn.functional.kl_div  # kl_div(a, b) = KL(b || a), b as log-probabilities
    if beta == 0:
        return kl(x, y, reduction="none", log_target=True).sum(-1)
    if beta == 1:
        return kl(y, x, reduction="none", log_target=True).sum(-1)
    m = torch.logsumexp(torch.stack([y + math.log(beta), x + math.log(1 - beta)]), 0)
    return (beta * kl(m, y, reduction="none", log_target=True).sum(-1)
            + (1 - beta) * kl(m, x, reduction="none", log_target=True).sum(-1))


def compare_got(args, loss, norm):
    """With --got "LOSS NORM" (llmcl-train's first step line), 1 where either differs from
    transformers' by more than --tol relative; 0 otherwise, and without --got."""
    if not args.got:
        return 0
    got_loss, got_norm = (float(x) for x in args.got.split())
    ok = abs(got_loss - loss) <= args.tol * abs(loss) and abs(got_norm - norm) <= args.tol * norm
    print(f"llmcl-train: loss {got_loss:.4f}, norm {got_norm:.3f} (tolerance {args.tol:g} "
          f"relative): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def distill(args):
    tokens = open(f"{args.dir}/tokens.bin", "rb").read()
    n = struct.unpack("<3i", tokens[:12])[2]
    tokens = struct.unpack(f"<{n}H", tokens[1024:1024 + 2 * n])
    ids, targets = first_batch(tokens, args.batch, args.seq)
    load = dict(torch_dtype=torch.float32, attn_implementation="eager")
    student = AutoModelForCausalLM.from_pretrained(args.dir, **load)
    teacher = AutoModelForCausalLM.from_pretrained(args.teacher, **load).eval()
    with torch.no_grad():
        t_logits = teacher(input_ids=ids).logits.float()
    s_logits = student(input_ids=ids).logits.float()
    v = s_logits.shape[-1]
    ce = torch.nn.functional.cross_entropy(s_logits.reshape(-1, v), targets.reshape(-1))
    d = divergence(s_logits, t_logits, args.beta, args.temperature).mean()
    loss = (1 - args.alpha) * ce + args.alpha * args.temperature ** 2 * d
    loss.backward()
    norm = math.sqrt(sum(p.grad.double().pow(2).sum().item() for p in student.parameters()))
    print(f"transformers: CE {ce.item():.6f}, D {d.item():.6f} (beta {args.beta:g}, temperature "
          f"{args.temperature:g}); loss (1 - {args.alpha:g}) CE + {args.alpha:g} x "
          f"{args.temperature:g}^2 D = {loss.item():.6f}, gradient norm {norm:.6f}")
    return compare_got(args, loss.item(), norm)


def write_pairs(path, n, vocab, seq, seed):
    """n preference pairs as TRL tokenizes them: a prompt and two completions, each of 1 to 3/4
    of seq tokens (so that some sequences pass seq and are cut)."""
    gen = torch.Generator().manual_seed(seed)
    draw = lambda: torch.randint(0, vocab, (int(torch.randint(1, seq * 3 // 4 + 1, (1,),
                                                                generator=gen)),),
                                 generator=gen).tolist()
    with open(path, "w") as f:
        for _ in range(n):
            f.write(json.dumps({"prompt_input_ids": draw(), "chosen_input_ids": draw(),
                                "rejected_input_ids": draw()}) + "\n")


def pair_rows(pairs, seq):
    """llmcl-train's rows of a step's pairs: the chosen sequences, then the rejected ones, each
    prompt + completion cut to seq tokens or padded with token 0 at its end; position i learns
    token i + 1 where that is the completion's (-100 elsewhere: the prompt, the padding, the last
    kept token)."""
    ids, labels = [], []
    for side in (1, 2):
        for pair in pairs:
            prompt, toks = len(pair[0]), (pair[0] + pair[side])[:seq]
            learn = [toks[i + 1] if i + 1 >= prompt else -100 for i in range(len(toks) - 1)]
            pad = seq - len(toks)
            ids.append(toks + [0] * pad)
            labels.append(learn + [-100] * (pad + 1))
    return torch.tensor(ids), torch.tensor(labels)


def sequence_logps(model, ids, labels, average):
    """Each row's log-probability of its scored targets, summed or averaged (0 where it has
    none), and the rows' per-position log-probabilities and mask."""
    logp = torch.log_softmax(model(input_ids=ids).logits.float(), -1)
    mask = labels != -100
    picked = logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask
    total, count = picked.sum(-1), mask.sum(-1)
    return (total / count.clamp(min=1) if average else total), picked, mask


def pair_terms(args, c, r, rc, rr):
    """The pairs' terms of TRL's losses (include/llmcl.h's table)."""
    sig = torch.nn.functional.logsigmoid
    eps = args.label_smoothing
    smooth = lambda z: -(1 - eps) * sig(z) - eps * sig(-z)
    if args.loss == "dpo":
        return smooth(args.beta * ((c - rc) - (r - rr)))
    if args.loss == "ipo":
        return ((c - rc) - (r - rr) - 1 / (2 * args.beta)) ** 2
    if args.loss == "simpo":
        return smooth(args.beta * (c - r) - args.gamma)
    if args.loss == "cpo":
        return smooth(args.beta * (c - r))
    return -args.beta * sig((c - r) - torch.log1p(-torch.exp(c)) + torch.log1p(-torch.exp(r)))


def preference(args):
    lines = [json.loads(l) for l in open(args.pairs) if l.strip()]
    pairs = [(p["prompt_input_ids"], p["chosen_input_ids"], p["rejected_input_ids"])
             for p in lines]
    held = int(len(pairs) * 0.05) or (1 if len(pairs) > 1 else 0)
    train = pairs[:len(pairs) - held]
    n = args.batch * args.accum * args.ranks  # the step's pairs; a small set repeats
    ids, labels = pair_rows([train[k % len(train)] for k in range(n)], args.seq)
    average = args.loss in ("ipo", "simpo", "orpo")
    if args.nll_weight is None:
        args.nll_weight = 1.0 if args.loss in ("orpo", "cpo") else 0.0
    if args.gamma is None:
        args.gamma = 0.5 if args.loss == "simpo" else 0.0
    load = dict(torch_dtype=torch.float32, attn_implementation="eager")
    policy = AutoModelForCausalLM.from_pretrained(args.dir, **load)
    pi, picked, mask = sequence_logps(policy, ids, labels, average)
    ref = torch.zeros_like(pi)
    if args.loss in ("dpo", "ipo"):
        reference = AutoModelForCausalLM.from_pretrained(args.ref or args.dir, **load).eval()
        with torch.no_grad():
            ref = sequence_logps(reference, ids, labels, average)[0]
    terms = pair_terms(args, pi[:n], pi[n:], ref[:n], ref[n:])
    nll = -picked[:n].sum() / mask[:n].sum().clamp(min=1)
    loss = terms.mean() + args.nll_weight * nll
    loss.backward()
    norm = math.sqrt(sum(p.grad.double().pow(2).sum().item() for p in policy.parameters()
                         if p.grad is not None))
    chosen, rejected = (args.beta * (pi - ref)).detach()[:n], (args.beta * (pi - ref)).detach()[n:]
    print(f"transformers: {args.loss} (beta {args.beta:g}, gamma {args.gamma:g}, label smoothing "
          f"{args.label_smoothing:g}, NLL weight {args.nll_weight:g}) over {n} pairs of {args.seq} "
          f"tokens: loss {loss.item():.6f} (pairs {terms.mean().item():.6f}, NLL {nll.item():.6f}),"
          f" gradient norm {norm:.6f}")
    print(f"rewards/chosen {chosen.mean():.4f} | rewards/rejected {rejected.mean():.4f} | "
          f"rewards/accuracies {(chosen > rejected).float().mean():.4f} | rewards/margins "
          f"{(chosen - rejected).mean():.4f} | logps/chosen {pi[:n].mean():.4f} | logps/rejected "
          f"{pi[n:].mean():.4f}")
    return compare_got(args, loss.item(), norm)


def first_batch_args(parser):
    """The first batch's shape, which llmcl-train's --batch and --seq must repeat."""
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make", help="a random model, its tokens and its loss")
    mk.add_argument("dir")
    mk.add_argument("--arch", choices=["llama", "mistral", "qwen2", "qwen3"], default="llama")
    mk.add_argument("--head-dim", type=int, default=0, help="0: dim / heads")
    mk.add_argument("--window", type=int, default=0, help="a sliding window on every layer")
    mk.add_argument("--attention-bias", action="store_true", help="llama and qwen3: q, k, v, o")
    mk.add_argument("--vocab", type=int, default=1024)
    mk.add_argument("--dim", type=int, default=256)
    mk.add_argument("--layers", type=int, default=2)
    mk.add_argument("--heads", type=int, default=4)
    mk.add_argument("--kv-heads", type=int, default=2)
    mk.add_argument("--ffn", type=int, default=688)
    mk.add_argument("--untied", action="store_true")
    first_batch_args(mk)
    mk.add_argument("--save-dtype", choices=["float32", "bfloat16"], default="float32")
    mk.add_argument("--seed", type=int, default=1234)
    mk.add_argument("--examples", type=int, default=0, help="also N examples in examples.jsonl")
    mk.add_argument("--pairs", type=int, default=0, help="also N preference pairs in pairs.jsonl")
    ad = sub.add_parser("adapter", help="a random PEFT LoRA adapter of DIR's model")
    ad.add_argument("dir")
    ad.add_argument("out")
    ad.add_argument("--r", type=int, default=8)
    ad.add_argument("--alpha", type=float, default=16)
    ad.add_argument("--targets", default="all-linear",
                    help="all-linear or a comma-separated list of module names")
    ad.add_argument("--rslora", action="store_true", help="scale alpha / sqrt(r)")
    ad.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ad.add_argument("--seed", type=int, default=4321)
    lg = sub.add_parser("logits", help="transformers' logits against llmcl-train's dump")
    lg.add_argument("dir", help="an --export folder, or the base model with --adapter")
    lg.add_argument("dump", help="llmcl-train --dump-logits FILE")
    lg.add_argument("--adapter", help="an adapter folder (PEFT's, or a LoRA run's --export)")
    lg.add_argument("--tol", type=float, default=1e-4,
                    help="allowed difference relative to the largest logit")
    ds = sub.add_parser("distill", help="the first step's distillation loss and gradient norm")
    ds.add_argument("dir", help="the student, made by make (its tokens.bin is the data)")
    ds.add_argument("teacher", help="the teacher: a folder of the same vocabulary")
    first_batch_args(ds)
    ds.add_argument("--alpha", type=float, default=0.5)
    ds.add_argument("--beta", type=float, default=0.0)
    ds.add_argument("--temperature", type=float, default=1.0)
    ds.add_argument("--got", help='llmcl-train\'s step 1: "LOSS NORM"')
    ds.add_argument("--tol", type=float, default=1e-3)
    pr = sub.add_parser("preference", help="the first step's preference loss and gradient norm")
    pr.add_argument("dir", help="the policy's starting checkpoint (--init-from)")
    pr.add_argument("pairs", help="the tokenized pairs (--data), e.g. make's pairs.jsonl")
    pr.add_argument("--loss", choices=["dpo", "ipo", "simpo", "cpo", "orpo"], default="dpo")
    pr.add_argument("--ref", help="DPO's and IPO's reference folder (default: DIR)")
    first_batch_args(pr)
    pr.add_argument("--accum", type=int, default=1)
    pr.add_argument("--ranks", type=int, default=1, help="the --zero job's ranks")
    pr.add_argument("--beta", type=float, default=0.1)
    pr.add_argument("--gamma", type=float, help="SimPO's (default 0.5)")
    pr.add_argument("--label-smoothing", type=float, default=0.0)
    pr.add_argument("--nll-weight", type=float, help="default 1 for orpo and cpo, else 0")
    pr.add_argument("--got", help='llmcl-train\'s step 1: "LOSS NORM"')
    pr.add_argument("--tol", type=float, default=1e-3)
    args = ap.parse_args()
    if args.cmd == "distill":
        return distill(args)
    if args.cmd == "preference":
        return preference(args)
    if args.cmd in ("make", "adapter"):
        (make if args.cmd == "make" else adapter)(args)
        return 0
    return logits(args)


if __name__ == "__main__":
    sys.exit(main())
