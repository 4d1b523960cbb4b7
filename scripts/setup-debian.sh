#!/usr/bin/env bash
# Installs what ptrain needs on Debian 12 (bookworm): LibTorch 1.13 (CPU) with gloo, the libraries
# ptrain builds on, python3-torch/torchvision as test oracles, chromium-headless-shell (the tests render
# `ptrain report`'s HTML charts in it), and Fashion-MNIST, the default dataset.
set -euo pipefail
packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libgloo-dev
  libyaml-cpp-dev libcli11-dev nlohmann-json3-dev
  libjpeg-dev libpng-dev zlib1g-dev
  libgtest-dev
  python3 python3-torch python3-torchvision python3-pil
  procps
  chromium-headless-shell
  dataset-fashion-mnist
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
