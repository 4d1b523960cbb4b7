#!/usr/bin/env bash
# Configures and builds ptrain in build/ (Release, Ninja, precompiled headers). Extra args go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$(nproc)"
