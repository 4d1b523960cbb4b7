#!/usr/bin/env python3
"""What an NCCL process group costs in device memory by itself, at world size 1, in PyTorch.

Prints the device's used memory (torch.cuda.mem_get_info, what nvidia-smi shows) after creating the CUDA
context, after init_process_group("nccl"), after an all-reduce, and after an all-gather and a reduce-scatter of
4 MiB, beside the caching allocator's own reserve: the part of a multi-process strategy's device memory that no
strategy can give back while its collectives run through NCCL. NCCL's settings come from the environment, e.g.
`NCCL_MAX_CTAS=1`, which ptrain sets in the communicator's config for a group of one rank (nccl_group_cuda.cpp).

    python3 scripts/nccl_memory_probe.py
    NCCL_MAX_CTAS=1 python3 scripts/nccl_memory_probe.py
"""
import os

import torch
import torch.distributed as dist


def used_gib():
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


def main():
    x = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    print(f"CUDA context only: used {used_gib():.3f} GiB")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
    print(f"after init_process_group: {used_gib():.3f}")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    print(f"after an all_reduce: {used_gib():.3f}")
    shard = torch.zeros(1 << 20, device="cuda")
    whole = torch.empty(1 << 20, device="cuda")
    dist.all_gather_into_tensor(whole, shard)
    dist.reduce_scatter_tensor(shard, whole)
    torch.cuda.synchronize()
    print(f"after an all_gather and a reduce_scatter: {used_gib():.3f}")
    print(f"the caching allocator's reserve: {torch.cuda.memory_reserved() / 2**30:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
