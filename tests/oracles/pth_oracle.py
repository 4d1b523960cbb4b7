"""Python's own torch.save / torch.load as the reference for the C++ .pth reader and writer.

  pth_oracle.py write FILE          torch.save(expected_tensors())   (an OrderedDict, as state_dict() gives)
  pth_oracle.py write-nested FILE   torch.save({"epoch": 3, "state_dict": expected_tensors()})
  pth_oracle.py write-mixed FILE    torch.save({"weight": tensor, "epoch": 3})   (a non-tensor entry)
  pth_oracle.py write-list FILE     torch.save([tensor])                          (not a dict)
  pth_oracle.py check FILE          torch.load(FILE) must equal expected_tensors(), in order
"""
import collections
import sys

import torch

from safetensors_oracle import check_against_expected, expected_tensors


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
    else:
        sys.exit(f"unknown command {command}")
    print("ok")


if __name__ == "__main__":
    main()
