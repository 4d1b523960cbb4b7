#!/usr/bin/env bash
# The GPU machine has PyTorch (and so CUDA LibTorch) but no package registry: this fetches, on a Debian
# machine, the .deb files of the libraries ptrain builds on, into .gpu-deps/debs (git-ignored), to be
# carried along and unpacked there by scripts/gpu_session.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu-deps/debs
cd .gpu-deps/debs
apt-get download libyaml-cpp-dev libyaml-cpp0.7 libcli11-dev nlohmann-json3-dev libgtest-dev \
  libjpeg62-turbo-dev libjpeg62-turbo libpng-dev libpng16-16 zlib1g-dev
