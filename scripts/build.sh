#!/usr/bin/env bash
# Configures and builds ptrain in build/ (Release, Ninja, precompiled headers, unity batches).
#   scripts/build.sh                    everything: the library, the ptrain app, the tests
#   scripts/build.sh --only ptrain_app  only what the ptrain command needs (README's first command)
# Other arguments go to cmake's configure step (e.g. -DPTRAIN_UNITY_BUILD=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
targets=()
configure_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --only) [ $# -ge 2 ] || { echo "scripts/build.sh: --only needs a target name (e.g. ptrain_app)" >&2; exit 2; }
            targets+=(--target "$2"); shift 2 ;;
    *) configure_args+=("$1"); shift ;;
  esac
done
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${configure_args[@]}"
cmake --build build -j "$(nproc)" "${targets[@]}"
