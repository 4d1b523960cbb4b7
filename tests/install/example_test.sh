#!/usr/bin/env bash
# ptrain as an installed library: `cmake --install` into a fresh prefix, then examples/custom_model (a model
# of its own) configured against it with find_package(ptrain) alone, built, and trained: in one process,
# and under zero3 over two processes started by the installed `ptrain launch`. The pkg-config file must
# name only libraries that exist.
#   example_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build_dir=$(cd "$1" && pwd)
source_dir=$(cd "$2" && pwd)
# A fixed place (not mktemp) so that ccache recognises the example's compile from one run to the next.
work="$build_dir/install_test"
rm -rf "$work"
mkdir -p "$work"
prefix="$work/prefix"

cmake --install "$build_dir" --prefix "$prefix" > "$work/install.log"
for f in lib/cmake/ptrain/ptrainConfig.cmake lib/cmake/ptrain/ptrainTargets.cmake lib/pkgconfig/ptrain.pc \
         include/ptrain/ptrain.h include/ptrain/api/user_model.h lib/libptrain_api.a bin/ptrain; do
  [ -e "$prefix/$f" ] || { echo "not installed: $f"; exit 1; }
done

flags=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs ptrain)
for word in $flags; do
  case "$word" in
    -l:*) [ -e "$prefix/lib/${word#-l:}" ] || { echo "ptrain.pc names a missing archive: $word"; exit 1; } ;;
    -I*) [ -d "${word#-I}" ] || { echo "ptrain.pc names a missing include directory: $word"; exit 1; } ;;
    /*) [ -e "$word" ] || { echo "ptrain.pc names a missing file: $word"; exit 1; } ;;
  esac
done

launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
cmake -S "$source_dir/examples/custom_model" -B "$work/example" "${generator[@]}" "${launcher[@]}" \
      -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" > "$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/example" -j 2 > "$work/build.log" || { cat "$work/build.log"; exit 1; }

"$work/example/custom_model" --steps 8 | tee "$work/single.log"
grep -q "custom_model: single fp32, 8 steps" "$work/single.log"
grep -q "hand-written step, autocast BFloat16 logits" "$work/single.log"

port=$(( 20000 + RANDOM % 20000 ))
"$prefix/bin/ptrain" launch --nproc-per-node 2 --master-port "$port" -- \
  "$work/example/custom_model" --strategy zero3 --steps 4 | tee "$work/zero3.log"
grep -q "custom_model: zero3 fp32, 4 steps" "$work/zero3.log"
echo "installed package, pkg-config file and example: fine"
