#!/usr/bin/env bash
# Probe of cuDNN's batch-norm fusion graphs at ResNet-50's shapes, then the ptrain build for the next call.
set -x
R=$OUT; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv > $R/gpu.txt 2>&1
CUDNN=$(python3 -c 'import nvidia.cudnn,os;print(os.path.dirname(nvidia.cudnn.__file__) if nvidia.cudnn.__file__ else nvidia.cudnn.__path__[0])' 2>/dev/null)
echo "cudnn wheel: $CUDNN" ; ls $CUDNN $CUDNN/lib $CUDNN/include 2>&1 | head -30
python3 -m pip show nvidia-cudnn-cu13 2>&1 | head -3
INC=.data/probe/include; [ -f $CUDNN/include/cudnn.h ] && INC=$CUDNN/include
nvcc -std=c++17 -O2 -arch=sm_90 -I$INC .data/probe/fusion_probe.cu -o /tmp/fusion_probe -L$CUDNN/lib -l:libcudnn.so.9 -Xlinker -rpath=$CUDNN/lib 2>&1 | grep -v Wno-deprecated | tail -20
timeout 300 /tmp/fusion_probe 128 both > $R/probe.txt 2>&1; echo "probe rc $?" >> $R/probe.txt
tail -5 $R/probe.txt
BUILD_TARGETS=ptrain OUT=$R scripts/gpu_session.sh build > $R/build.txt 2>&1; echo "build rc $?"; tail -3 $R/build.txt
