#!/usr/bin/env bash
# The third call, about 510 s: ResNet-50 fp16, amp-fp16 and tf32, each beside PyTorch compiled with CUDA graphs (the
# pairs issue 25 asks 1.05x of), then amp-bf16 with the caching allocator's expandable segments (does reserved and
# NVML come down, and does the graph still capture?). Carry .gpu-deps and .data, as for next-call-2.sh.
source "$(dirname "$0")/owed-calls.sh"
build ptrain
[ $(left 510) -gt 150 ] && pair fp16 $(( $(left 510) - 30 ))
[ $(left 510) -gt 160 ] && pair amp-fp16 $(( $(left 510) - 30 ))
[ $(left 510) -gt 160 ] && pair tf32 $(( $(left 510) - 30 ))
if [ $(left 560) -gt 70 ]; then
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 60 build-gpu/ptrain train --config .data/r50.yaml --precision amp-bf16 \
    --progress none --metrics-out $R/ptrain-amp-bf16-expandable.json > $R/ptrain-amp-bf16-expandable.log 2>&1
  echo "ptrain-amp-bf16-expandable rc=$?"; show $R/ptrain-amp-bf16-expandable.json; pack
fi
echo "all done $(( $(date +%s) - t0 )) s"
