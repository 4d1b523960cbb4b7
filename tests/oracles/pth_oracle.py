"""Python's own torch.save / torch.load as the reference for the C++ .pth reader and writer.

  pth_oracle.py write FILE          torch.save(expected_tensors())   (an OrderedDict, as state_dict() gives)
  pth_oracle.py write-nested FILE   torch.save({"epoch": 3, "state_dict": expected_tensors()})
  pth_oracle.py write-mixed FILE    torch.save({"weight": tensor, "epoch": 3})   (a non-tensor entry)
  pth_oracle.py write-list FILE     torch.save([tensor])                          (not a dict)
  pth_oracle.py check FILE          torch.load(FILE) must equal expected_tensors(), in order
  pth_oracle.py check-weights-only FILE
                                    torch.load(FILE, weights_only=True) must be an OrderedDict equal to
                                    expected_tensors() followed by view_tensors(), in order
"""
import collections
import sys

import torch

from safetensors_oracle import check_against_expected, expected_tensors


def view_tensors():
    """Views of larger tensors (an offset, strides) that the C++ test writes; the same formulas."""
    t = collections.OrderedDict()
    t["offset"] = torch.arange(10, dtype=torch.float32)[3:8]
    t["strided_f16"] = (torch.arange(20, dtype=torch.float32) * 0.5).to(torch.float16).view(4, 5)[1:, ::2]
    t["column_bf16"] = (torch.arange(12, dtype=torch.float32) * 0.25).to(torch.bfloat16).view(3, 4)[:, 1]
    return t


def check_weights_only(path):
    loaded = torch.load(path, weights_only=True)
    if type(loaded) is not collections.OrderedDict:
        sys.exit(f"torch.load(weights_only=True) gave a {type(loaded).__name__}, expected an OrderedDict")
    expected = expected_tensors()
    expected.update(view_tensors())
    if list(loaded) != list(expected):
        sys.exit(f"keys {list(loaded)}, expected {list(expected)}")
    for name, tensor in expected.items():
        got = loaded[name]
        if got.dtype != tensor.dtype or got.shape != tensor.shape or not torch.equal(got, tensor):
            sys.exit(f"{name}: got {got.dtype} {tuple(got.shape)} {got}, expected {tensor.dtype} {tuple(tensor.shape)} {tensor}")


def main():
    command, path = sys.argv[1], sys.argv[2]
    if command == "write":
        torch.save(expected_tensors(), path)
    elif command == "write-nested":
        torch.save({"epoch": 3, "state_dict": expected_tensors()}, path)
    elif command == "write-mixed":
        torch.save(collections.OrderedDict([("weight", torch.ones(2)), ("epoch", 3)]), path)
    elif command == "write-list":
        torch.save([torch.ones(2)], path)
    elif command == "check":
        loaded = torch.load(path)
        if not isinstance(loaded, dict):
            sys.exit(f"torch.load gave a {type(loaded).__name__}, expected a dict")
        check_against_expected(collections.OrderedDict(loaded))
    elif command == "check-weights-only":
        check_weights_only(path)
    else:
        sys.exit(f"unknown command {command}")
    print("ok")


if __name__ == "__main__":
    main()
