#!/usr/bin/env bash
# The call after next-call.sh (once its GPU tests passed), about 510 s: the 5-epoch references in amp-bf16 and in
# fp16 with master weights (issue 25: each within a point of its accuracy), the kernels' GPU tests three times
# (a test that fails at random is a defect), ResNet-50 bf16 beside PyTorch compiled with CUDA graphs.
# Carry .gpu-deps and .data (.data/r50.yaml from 2026-12-04-h200-conv-bn-fusion/r50.yaml, .data/cifar10-jpg.tar.xz).
source "$(dirname "$0")/owed-calls.sh"
build "ptrain test_kernels"
OUT=$R timeout 100 scripts/gpu_session.sh reference amp-bf16 > $R/reference-amp-bf16.txt 2>&1; grep -E "result|^epoch" $R/reference-amp-bf16.txt | tail -n 3; pack
OUT=$R timeout 100 scripts/gpu_session.sh reference fp16+master > $R/reference-fp16-master.txt 2>&1; grep -E "result|^epoch" $R/reference-fp16-master.txt | tail -n 3; pack
echo "references done $(( $(date +%s) - t0 )) s"
timeout 90 ./build-gpu/tests/kernels/test_kernels --gtest_repeat=3 \
  --gtest_filter='FusedMaxPool2d*:ParameterCast*:FusedShortcut*:FusedBatchNorm*:FusedKernels*:GlobalAveragePool*:Captured*:ConvBatchNorm*:StemConv*' \
  > $R/tests-repeat3.txt 2>&1; echo "tests rc $?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Repeating" $R/tests-repeat3.txt | head -10; pack
[ $(left 510) -gt 150 ] && pair bf16 $(( $(left 510) - 30 ))
echo "all done $(( $(date +%s) - t0 )) s"
