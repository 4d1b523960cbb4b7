"""Independent safetensors reader and writer for the io tests.

Debian has no safetensors package, so this is a pure-Python implementation straight from the format
description (8-byte little-endian header length, JSON header, raw little-endian data), written apart
from the C++ one so that a misreading of the format in one shows up against the other.

  safetensors_oracle.py write FILE     writes expected_tensors() (keys sorted in the JSON, as the
                                       reference writer does; data in insertion order) with metadata
  safetensors_oracle.py check FILE     reads FILE (written by C++) and checks it holds expected_tensors()
                                       in order, with the metadata, 8-byte aligned data and no gaps
"""
import collections
import json
import struct
import sys

import torch

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
NAMES = {dtype: name for name, dtype in DTYPES.items()}
METADATA = {"format": "pt", "producer": "ptrain-test"}


def expected_tensors():
    """Values exactly representable in their dtypes; the C++ tests build the same ones from the same formulas."""
    t = collections.OrderedDict()
    t["f64"] = torch.arange(6, dtype=torch.float64).reshape(2, 3) / 4 - 1
    t["f32"] = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) * 0.5 - 3
    t["f16"] = (torch.arange(10, dtype=torch.float32) * 0.25).to(torch.float16)
    t["bf16"] = (torch.arange(8, dtype=torch.float32) * 0.5 - 2).to(torch.bfloat16)
    t["i64"] = torch.arange(5, dtype=torch.int64) * (1 << 40) - 7
    t["i32"] = torch.arange(6, dtype=torch.int32).reshape(3, 2) * -100000
    t["i16"] = torch.arange(4, dtype=torch.int16) * -300
    t["i8"] = torch.arange(-4, 4, dtype=torch.int8)
    t["u8"] = torch.arange(250, 256, dtype=torch.uint8)
    t["bool"] = torch.arange(5) % 2 == 0
    t["scalar"] = torch.tensor(3.5, dtype=torch.float32)
    t["empty"] = torch.zeros(0, 3, dtype=torch.float32)
    # Written from a transposed (non-contiguous) tensor on the C++ side.
    t["transposed"] = torch.arange(12, dtype=torch.float32).reshape(3, 4).t().contiguous()
    return t


def write(path, tensors, metadata):
    header = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name, tensor in tensors.items():
        raw = tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        header[name] = {"dtype": NAMES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, sort_keys=True).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    assert n % 8 == 0, f"header length {n} leaves the data unaligned"
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    metadata = header.pop("__metadata__", {})
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    tensors = collections.OrderedDict()
    end_of_previous = 0
    for name, info in entries:
        begin, end = info["data_offsets"]
        assert begin == end_of_previous, f"{name}: data starts at {begin}, expected {end_of_previous}"
        end_of_previous = end
        dtype = DTYPES[info["dtype"]]
        raw = bytearray(body[begin:end])
        flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.zeros(0, dtype=dtype)
        tensors[name] = flat.reshape(info["shape"]).clone()
    assert end_of_previous == len(body), f"{len(body) - end_of_previous} trailing bytes after the data"
    return tensors, metadata


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def check_against_expected(tensors):
    expected = expected_tensors()
    if list(tensors.keys()) != list(expected.keys()):
        sys.exit(f"names or order differ: {list(tensors.keys())} != {list(expected.keys())}")
    for name, tensor in expected.items():
        if not same(tensors[name], tensor):
            sys.exit(f"{name}: got {tensors[name].dtype} {tuple(tensors[name].shape)} {tensors[name]}, "
                     f"expected {tensor.dtype} {tuple(tensor.shape)} {tensor}")


def main():
    command, path = sys.argv[1], sys.argv[2]
    if command == "write":
        write(path, expected_tensors(), METADATA)
    elif command == "check":
        tensors, metadata = read(path)
        if metadata != METADATA:
            sys.exit(f"metadata {metadata} != {METADATA}")
        check_against_expected(tensors)
    else:
        sys.exit(f"unknown command {command}")
    print("ok")


if __name__ == "__main__":
    main()
