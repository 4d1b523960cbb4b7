#!/usr/bin/env bash
# The GPU machine has PyTorch (and so CUDA LibTorch) but no package registry: this fetches, on a Debian
# machine, the .deb files of the libraries ptrain builds on that the GPU image lacks, into .gpu-deps/debs
# (git-ignored), to be carried along and unpacked there by scripts/gpu_session.sh. libjpeg, libpng and
# zlib come with the GPU image: carrying Debian's would mix two ABIs (headers of one, library of the other).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu-deps/debs
cd .gpu-deps/debs
apt-get download libyaml-cpp-dev libyaml-cpp0.7 libcli11-dev nlohmann-json3-dev libgtest-dev
