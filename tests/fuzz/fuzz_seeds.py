#!/usr/bin/env python3
"""fuzz_seeds.py: writes small valid seed inputs for the harnesses of tests/fuzz/ into
OUT/<harness>/ (fuzz_safetensors, fuzz_tune_db, fuzz_token_file, fuzz_hf_config). Usage:
    python3 tests/fuzz/fuzz_seeds.py OUT
The inputs are made here rather than committed: a binary corpus is not kept in the tree."""
import json
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, raw bytes)] in file order."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def llmc(magic, version, tokens):
    header = [magic, version, len(tokens)] + [0] * 253
    fmt = "<H" if magic == 20240520 else "<I"
    return struct.pack("<256i", *header) + b"".join(struct.pack(fmt, t) for t in tokens)


def main():
    out = sys.argv[1]
    seeds = {"fuzz_safetensors": {}, "fuzz_tune_db": {}, "fuzz_token_file": {},
             "fuzz_hf_config": {}, "fuzz_checkpoint": {}}
    s = seeds["fuzz_safetensors"]
    s["two.safetensors"] = safetensors(
        [("w", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)),
         ("b", "BF16", [3], b"\x80\x3f" * 3)], {"format": "pt"})
    s["empty.safetensors"] = safetensors([("e", "I64", [0, 5], b"")])
    s["micro.safetensors"] = safetensors([("f4", "F4", [4], b"\x12\x34"),
                                          ("u8", "U8", [], b"\x07")])
    s["none.safetensors"] = safetensors([], {})
    fixture = os.path.join(ROOT, "tests", "data", "fixture.safetensors")
    if os.path.getsize(fixture) <= 16384:
        s["fixture.safetensors"] = open(fixture, "rb").read()

    t = seeds["fuzz_tune_db"]
    for name in sorted(os.listdir(os.path.join(ROOT, "data", "tuning"))):
        full = json.load(open(os.path.join(ROOT, "data", "tuning", name)))
        full["entries"] = full["entries"][:6]  # keeps seeds small
        t[name] = json.dumps(full, indent=1).encode()
    t["any.json"] = json.dumps({
        "format": "llmcl-tuning", "version": 1, "device": {"name": "*"},
        "entries": [{"kernel": "matmul", "dtype": "f32", "shape_class": "p12",
                     "params": {"WG": 128, "TILE_M": 64}},
                    {"kernel": "matmul", "params": {"WG": 64}},
                    {"kernel": "norm_fwd", "dtype": "*", "shape_class": "4096",
                     "params": {"ROWS_WG": 4}}]}).encode()

    d = seeds["fuzz_token_file"]
    d["gpt2.bin"] = b"\x06" + llmc(20240520, 1, [1, 50256, 3, 4, 5])
    d["llama3.bin"] = b"\x06" + llmc(20240801, 7, [128000, 9, 128255])
    d["auto_magic"] = b"\x00" + llmc(20240520, 1, [7, 8])
    d["text"] = b"\x01" + b"The cat sees the red ball.\n"
    lines = [{"input_ids": [1, 2, 3, 4], "labels": [-100, -100, 3, 4]},
             {"input_ids": [5, 6, 7], "completion_mask": [0, 1, 1], "attention_mask": [1, 1, 1]},
             {"input_ids": [0, 9, 10, 11, 12], "assistant_masks": [False, True, True, False, True],
              "attention_mask": [0, 1, 1, 1, 1]}]
    jsonl = "\n".join(json.dumps(l) for l in lines).encode() + b"\n\n"
    d["examples_auto"] = b"\x08" + jsonl
    d["examples_forced"] = b"\x03" + jsonl
    pairs = [{"prompt_input_ids": [1, 2, 3], "chosen_input_ids": [4, 5], "rejected_input_ids": [6]},
             {"prompt_input_ids": [], "chosen_input_ids": [7, 8, 9, 10, 11, 12, 13, 14],
              "rejected_input_ids": [15, 16], "prompt": "text"}]
    d["pairs"] = b"\x20" + "\n".join(json.dumps(l) for l in pairs).encode() + b"\n"

    h = seeds["fuzz_hf_config"]
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256,
              "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "hidden_act": "silu", "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False,
              "mlp_bias": False, "tie_word_embeddings": True, "torch_dtype": "float32"}
    h["config"] = b"\x00" + json.dumps(config).encode()
    llama3 = dict(config, rope_scaling={"factor": 32.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 8192,
                                        "rope_type": "llama3"})
    h["config_llama3"] = b"\x00" + json.dumps(llama3).encode()
    v5 = dict(config, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    del v5["rope_theta"]
    h["config_v5"] = b"\x00" + json.dumps(v5).encode()
    mistral = dict(config, architectures=["MistralForCausalLM"], model_type="mistral",
                   sliding_window=64)
    h["config_mistral"] = b"\x00" + json.dumps(mistral).encode()
    qwen2 = dict(config, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                 use_sliding_window=True, sliding_window=32, max_window_layers=0)
    h["config_qwen2"] = b"\x00" + json.dumps(qwen2).encode()
    qwen3 = dict(config, architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=24,
                 attention_bias=True, layer_types=["full_attention", "full_attention"])
    h["config_qwen3"] = b"\x00" + json.dumps(qwen3).encode()
    h["index"] = b"\x01" + json.dumps({"metadata": {"total_size": 8}, "weight_map": {
        "model.embed_tokens.weight": "a.safetensors",
        "model.norm.weight": "b.safetensors"}}).encode()
    adapter = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": None,
               "r": 16, "lora_alpha": 32, "target_modules": ["q_proj", "v_proj", "down_proj"],
               "lora_dropout": 0.05, "bias": "none", "fan_in_fan_out": False, "use_rslora": False,
               "use_dora": False, "rank_pattern": {}, "alpha_pattern": {}, "modules_to_save": None,
               "layers_to_transform": None, "init_lora_weights": True}
    h["adapter"] = b"\x02" + json.dumps(adapter).encode()
    h["adapter_rslora"] = b"\x02" + json.dumps(dict(adapter, use_rslora=True,
                                                     target_modules="all-linear")).encode()

    # fuzz_checkpoint's model (tiny_model): embeddings [8, 16] and a final norm [16], f32
    c = seeds["fuzz_checkpoint"]
    shape = {"format": "llmcl-train checkpoint 1", "vocab": "8", "dim": "16", "layers": "1",
             "heads": "2", "kv_heads": "1", "ffn": "32", "tied": "1",
             "norm_eps": "%.9g" % struct.unpack("<f", struct.pack("<f", 1e-5))[0],
             "rope_theta": "10000", "rope_llama3_factor": "0", "step": "12", "data_pos": "3072"}
    params = [("model.embed_tokens.weight", [8, 16]), ("model.norm.weight", [16])]
    def states(names):
        out = []
        for prefix in ("", "optimizer.m.", "optimizer.v."):
            for name, dims in names:
                out.append((prefix + name, "F32", dims, b"\0" * 4 * dims[0] * (dims[-1] if
                                                                             len(dims) > 1 else 1)))
        return out
    c["full"] = b"\x00" + safetensors(states(params), shape)
    lora = dict(shape, lora_rank="2", lora_alpha="4", lora_targets="q_proj", lora_dtype="f32",
                base_fingerprint="0123456789abcdef")
    c["lora"] = b"\x01" + safetensors(states(params[1:]), lora)

    for harness, files in seeds.items():
        os.makedirs(os.path.join(out, harness), exist_ok=True)
        for name, data in files.items():
            with open(os.path.join(out, harness, name), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
