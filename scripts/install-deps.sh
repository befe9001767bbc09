#!/usr/bin/env bash
# Install kvxfer's build, test and benchmark dependencies from Debian 12's archive.
# Idempotent; needs root (or sudo). Usage: bash scripts/install-deps.sh [--vm]
#   --vm  also install what the Soft-RoCE VM harness (tests/rxe/) needs.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
pkgs=(
  build-essential cmake pkg-config clang
  libibverbs-dev librdmacm-dev ibverbs-providers rdma-core ibverbs-utils perftest
  liburcu-dev libmsgpack-dev libzmq3-dev libsodium-dev libcriterion-dev libnuma-dev libjansson-dev
  libmicrohttpd-dev curl iproute2
  libamdhip64-dev
  gnuplot-nox iperf3 ucx-utils python3
  python3-dev python3-setuptools python3-wheel python3-pip python3-pytest python3-torch python3-numpy
  python3-zmq python3-msgpack
)
if [ "${1:-}" = "--vm" ]; then
  pkgs+=(qemu-system-x86 linux-image-amd64 busybox-static kmod)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages already installed"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
