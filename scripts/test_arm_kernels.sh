#!/usr/bin/env bash
# Cross-builds the CPU kernels (cb_platform, cb_kernels) and their tests
# (test_kernels) for aarch64 and runs the tests under qemu-user, so the NEON
# kernels are proven against the scalar reference, not just compiled.
#
#   scripts/test_arm_kernels.sh [BUILD_DIR]      (default: build-arm64)
#
# Installs what is missing first (idempotent): the cross compiler, qemu-user
# and the arm64 multiarch -dev packages the top-level CMakeLists.txt looks
# for.  QEMU_CPU picks the emulated CPU (default "max": NEON + dot product);
# set QEMU_CPU=cortex-a53 to run the NEON kernels without dot product.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build-arm64}"
JOBS="${JOBS:-$(nproc)}"

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
APT=(env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -y -q)

HOST_PKGS=(g++-aarch64-linux-gnu qemu-user cmake pkg-config nlohmann-json3-dev)
ARM_PKGS=(libstdc++6:arm64 libgcc-s1:arm64 libgtest-dev:arm64 libmimalloc-dev:arm64 libxxhash-dev:arm64 libzstd-dev:arm64
          libsqlite3-dev:arm64 libutf8proc-dev:arm64)

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

missing=()
for p in "${HOST_PKGS[@]}" "${ARM_PKGS[@]}"; do installed "$p" || missing+=("$p"); done
if ((${#missing[@]})); then
  echo "test_arm_kernels: installing ${missing[*]}"
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    $SUDO dpkg --add-architecture arm64
  fi
  $SUDO "${APT[@]}" update
  $SUDO "${APT[@]}" install --no-install-recommends "${missing[@]}"
fi

cmake -S "$ROOT" -B "$BUILD" -DCMAKE_TOOLCHAIN_FILE="$ROOT/scripts/aarch64-linux-gnu.cmake" \
  -DCMAKE_BUILD_TYPE=Release -DCB_CUDA=OFF >/dev/null
cmake --build "$BUILD" -j"$JOBS" --target cb_platform cb_kernels test_kernels

export QEMU_CPU="${QEMU_CPU:-max}"
# -L /: the arm64 loader, libc and libraries (mimalloc, xxhash) come from the
# multiarch directories the -dev packages installed into.  (With the cross
# toolchain's copy, -L /usr/aarch64-linux-gnu, qemu-user 7.2 hangs in
# pthread_create of dynamically linked programs on this host.)
qemu-aarch64 -L / "$BUILD/bin/test_kernels" --gtest_brief=1
