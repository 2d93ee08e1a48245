#!/usr/bin/env bash
# The README's first command: installs the Debian packages llmcl needs, builds it in build/, checks
# that an outside program builds against the installed library through pkg-config, trains a tiny
# model with llmcl-train and runs llmcl-bench on the default device (PoCL's CPU device where there
# is no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(gcc pkg-config meson ninja-build python3
          ocl-icd-opencl-dev opencl-c-headers pocl-opencl-icd mesa-opencl-icd clinfo
          libclblast-dev libcmocka-dev libjansson-dev libxxhash-dev mpich libmpich-dev)
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing: ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

echo "== building"
[ -d build ] || meson setup build --werror
ninja -C build

echo "== checking an outside build against the installed library (pkg-config)"
prefix=$(mktemp -d /tmp/llmcl-prefix.XXXXXX)
meson setup build-install --prefix="$prefix" --libdir=lib >/dev/null
meson install -C build-install --quiet
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" cc -std=c11 -Wall -Werror examples/basic.c \
    $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs llmcl) -o "$prefix/basic"
LD_LIBRARY_PATH="$prefix/lib" "$prefix/basic"
rm -rf "$prefix" build-install

echo "== llmcl-train: a tiny Llama-style model on a generated corpus, on the default device"
build/tools/llmcl-train

echo "== llmcl-bench on the default device"
build/tools/llmcl-bench
