# Sourced by next-call-2.sh and next-call-3.sh: where results go, packing them as they come (a call cut short still
# returns what it finished), the build, and a ResNet-50 mode beside PyTorch compiled with CUDA graphs.
R=$OUT/r; mkdir -p $R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pack() { tar -czf $OUT/call.tgz.part -C $OUT r && mv $OUT/call.tgz.part $OUT/call.tgz; }
t0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - t0) )); }
build() {  # TARGETS
  BUILD_TARGETS="$1" OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?"
  export LD_LIBRARY_PATH=$PWD/.gpu-deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
  echo "build done $(( $(date +%s) - t0 )) s"; pack
}
show() { python3 -c "
import json,sys;r=json.load(open(sys.argv[1]));g=2**30
print(' steady %.1f' % (r.get('steady_images_per_second') or 0), 'alloc %.2f reserved %.2f nvml %.2f' % ((r.get('peak_allocated_bytes') or 0)/g, (r.get('peak_reserved_bytes') or 0)/g, (r.get('peak_nvml_used_bytes') or 0)/g))" $1 2>&1 | cut -c1-300; }
pair() {  # MODE SECONDS: ptrain, then PyTorch compiled with CUDA graphs, same workload
  local P=$1
  timeout 60 build-gpu/ptrain train --config .data/r50.yaml --precision $P --progress none --metrics-out $R/ptrain-$P.json > $R/ptrain-$P.log 2>&1
  echo "ptrain-$P rc=$?"; show $R/ptrain-$P.json
  timeout $2 python3 bench/pytorch_reference.py --precision $P --model resnet50 --dataset cifar10 --data .data/cifar10 \
    --image-size 224 --batch-size 128 --max-steps 30 --train-limit 3840 --test-limit 256 --channels-last --compile \
    --compile-mode reduce-overhead --fused-optimizer --metrics-out $R/pytorch-$P-graphs.json > $R/pytorch-$P-graphs.log 2>&1
  echo "pytorch-$P-graphs rc=$?"; show $R/pytorch-$P-graphs.json; pack
}
