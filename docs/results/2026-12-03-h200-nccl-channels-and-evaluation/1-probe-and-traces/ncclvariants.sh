#!/usr/bin/env bash
# The device memory a world-size-1 NCCL group takes, under NCCL settings one at a time (PyTorch 2.11).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
probe() { echo "== $*"; env "$@" python3 scripts/nccl_memory_probe.py 2>&1 | grep -vE "^\[W|Warning" | tr '\n' ' '; echo; }
probe X=base
probe CUDA_MODULE_LOADING=EAGER
probe CUDA_MODULE_LOADING=LAZY
probe NCCL_CUMEM_ENABLE=0
probe NCCL_RUNTIME_CONNECT=0
probe NCCL_WIN_ENABLE=0
probe NCCL_SET_STACK_SIZE=0
probe NCCL_SET_STACK_SIZE=1
probe NCCL_MAX_NCHANNELS=1
probe NCCL_BUFFSIZE=1048576
probe NCCL_CTA_POLICY=ZERO
probe NCCL_RAS_ENABLE=0
probe NCCL_GRAPH_REGISTER=0
echo "== alloc log"
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ALLOC,INIT python3 scripts/nccl_memory_probe.py > $1 2>&1
grep -c "Alloc" $1; grep -E "used|Alloc Size|cuMem" $1 | awk '{print}' | head -5
python3 - "$1" <<'PY'
import re, sys
tot = 0; n = 0; big = []
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"(?:Mem Alloc|cudaMalloc|Cuda Alloc|cuMem\w*)\D*[Ss]ize (\d+)", line)
    if m:
        s = int(m.group(1)); tot += s; n += 1
        if s >= 1 << 20: big.append(line.strip()[:200])
print("alloc lines", n, "total MiB", tot / 2**20)
print("\n".join(big[:30]))
PY
