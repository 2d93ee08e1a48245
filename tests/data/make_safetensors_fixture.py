#!/usr/bin/env python3
"""Writes tests/data/fixture.safetensors, a small file laid out byte for byte as Hugging Face's
safetensors writer (safetensors.torch.save_file) lays it out, using only the standard library:

- tensors ordered by falling dtype alignment (the reference's Dtype enum order), then by name;
- the header is compact JSON (no spaces), "__metadata__" first, each tensor's keys in the order
  dtype, shape, data_offsets, non-ASCII text kept as UTF-8;
- the header is padded with spaces to a multiple of 8 bytes, its length a little-endian u64;
- the data follows, little-endian, row-major, with no gaps.

test_safetensors.c reads the committed file and checks every value listed here. Run it again only
if the fixture must change: python3 tests/data/make_safetensors_fixture.py

With --torch (where PyTorch and the safetensors package exist) the same tensors go through Hugging
Face's own safetensors.torch.save_file into fixture_torch.safetensors, which the test reads too.
"""
import json
import os
import struct
import sys

# The reference implementation's order of rising alignment, and element sizes in bytes.
DTYPE_ORDER = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
               "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64"]


def bf16(values):
    # Each value is exactly representable in bf16, so dropping the low half of the f32 is exact.
    return b"".join(struct.pack("<f", v)[2:] for v in values)


TENSORS = {
    "model.embed.weight": ("BF16", [2, 3], bf16([1.0, -2.0, 0.5, 3.25, -0.125, 100.0])),
    "model.norm.weight": ("F32", [4], struct.pack("<4f", 1.0, 0.1, -3.5, 1e-3)),
    "lm_head.bias": ("F16", [3], struct.pack("<3e", 0.5, -1.5, 65504.0)),
    "step": ("I64", [], struct.pack("<q", 42)),
    "mask": ("U8", [5], bytes([0, 1, 2, 3, 255])),
    "empty": ("F32", [0, 3], b""),
}
METADATA = {"format": "pt"}


def serialize(tensors, metadata):
    names = sorted(tensors, key=lambda n: (-DTYPE_ORDER.index(tensors[n][0]), n.encode()))
    header = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name in names:
        dtype, shape, data = tensors[name]
        end = offset + len(data)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(tensors[n][2] for n in names)


def save_with_torch(path):
    import torch
    from safetensors.torch import save_file

    codes = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16,
             "I64": torch.int64, "U8": torch.uint8}
    tensors = {}
    for name, (dtype, shape, data) in TENSORS.items():
        t = torch.frombuffer(bytearray(data), dtype=codes[dtype]) if data else torch.empty(0)
        tensors[name] = t.to(codes[dtype]).reshape(shape)
    save_file(tensors, path, metadata=METADATA)


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    torch_mode = "--torch" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--torch"]
    name = "fixture_torch.safetensors" if torch_mode else "fixture.safetensors"
    path = args[0] if args else os.path.join(here, name)
    if torch_mode:
        save_with_torch(path)
    else:
        with open(path, "wb") as f:
            f.write(serialize(TENSORS, METADATA))
