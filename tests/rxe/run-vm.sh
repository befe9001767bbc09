#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Boot the distribution kernel in a QEMU (TCG) VM with Soft-RoCE (rdma_rxe) and run a payload.
#
# Usage: tests/rxe/run-vm.sh [-b BUILD_DIR] [-t SECONDS] [-m MEM] [-w WORK_DIR] [PAYLOAD [ARGS...]]
#   -b BUILD_DIR  kvxfer build directory the payload uses (exported to it as KVX_BUILD_DIR).
#                 Default: $KVX_BUILD_DIR, else <repo>/build. The VM sees the host root
#                 read-only over virtio-9p, so the directory is visible at the same path.
#   -t SECONDS    hard time limit for the whole VM run (default $KVX_VM_TIMEOUT or 590).
#   -m MEM        guest memory (default 1536M).
#   -w WORK_DIR   where the initramfs is built and the output share lives (default
#                 $KVX_VM_WORK, else tests/rxe/work): give each concurrent VM run its own.
#   PAYLOAD       script run inside the VM by bash (default: tests/rxe/payload-verbs.sh).
#                 That is the verbs job (verbs tests, conformance, kvxfer-perf vs perftest);
#                 payload-smoke.sh only checks rxe0 + ib_write_bw. The payload runs as root with the
#                 host root read-only, a tmpfs /tmp, rxe0 on lo (port 1 ACTIVE) and
#                 $KVX_VM_OUT, a writable directory shared with the host.
# Output: the VM console (kernel + payload stdout/stderr) is printed and kept in
# WORK_DIR/out/console.log; files the payload writes to $KVX_VM_OUT land in WORK_DIR/out/. Exit status: the payload's, or 124 on timeout, 125 on harness errors.
# Facts this relies on (Debian 12): KVM hangs on these hosts, so TCG; modules are loaded with
# busybox insmod in dependency order resolved through `modinfo -k VERSION -F depends`.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
BUILD="${KVX_BUILD_DIR:-$REPO/build}"
TIMEOUT_S="${KVX_VM_TIMEOUT:-590}"
MEM="1536M"
WORK="${KVX_VM_WORK:-$REPO/tests/rxe/work}"
while getopts "b:t:m:w:h" o; do
  case "$o" in
    b) BUILD="$OPTARG" ;;
    t) TIMEOUT_S="$OPTARG" ;;
    m) MEM="$OPTARG" ;;
    w) WORK="$OPTARG" ;;
    *) sed -n '3,20p' "$0"; exit 125 ;;
  esac
done
shift $((OPTIND - 1))
PAYLOAD="${1:-$HERE/payload-verbs.sh}"
[ $# -gt 0 ] && shift
PAYLOAD="$(realpath "$PAYLOAD")"
BUILD="$(realpath -m "$BUILD")"
die() { echo "run-vm: $*" >&2; exit 125; }
[ -f "$PAYLOAD" ] || die "payload '$PAYLOAD' not found"
[ "$(id -u)" -eq 0 ] || die "needs root (9p passthrough of the host root, mknod in the initramfs)"

KVER="${KVX_VM_KERNEL:-}"
if [ -z "$KVER" ]; then
  KVER="$(ls /boot/vmlinuz-* 2>/dev/null | sed 's|.*/vmlinuz-||' | sort -V | tail -1)"
fi
[ -n "$KVER" ] && [ -f "/boot/vmlinuz-$KVER" ] || die "no /boot/vmlinuz-* (install linux-image-amd64)"
[ -d "/lib/modules/$KVER" ] || die "no /lib/modules/$KVER"
BUSYBOX="$(command -v busybox || true)"
[ -n "$BUSYBOX" ] && file -L "$BUSYBOX" 2>/dev/null | grep -q static || BUSYBOX=/bin/busybox
ldd "$BUSYBOX" >/dev/null 2>&1 && die "$BUSYBOX is not static (install busybox-static)"
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 missing (install qemu-system-x86)"

mkdir -p "$WORK"
WORK="$(realpath "$WORK")"
OUT="$WORK/out"
STAGE="$WORK/initramfs"
rm -rf "$STAGE" "$OUT"
mkdir -p "$STAGE"/{bin,dev,proc,sys,newroot,lib/modules} "$OUT"

# Modules in dependency order (depth-first post-order over `modinfo -F depends`).
declare -A seen=()
order=()
visit() {
  local m="$1" d
  [ -n "${seen[$m]:-}" ] && return 0
  seen[$m]=1
  for d in $(modinfo -k "$KVER" -F depends "$m" | tr ',' ' '); do visit "$d"; done
  order+=("$m")
}
for m in virtio_pci 9pnet_virtio 9p rdma_rxe; do visit "$m"; done
for m in "${order[@]}"; do
  f="$(modinfo -k "$KVER" -n "$m")"
  case "$f" in
    *.ko) cp "$f" "$STAGE/lib/modules/$m.ko" ;;
    *.ko.xz) xz -dc "$f" > "$STAGE/lib/modules/$m.ko" ;;
    *.ko.zst) zstd -qdc "$f" > "$STAGE/lib/modules/$m.ko" ;;
    *) die "module $m: unexpected file $f" ;;
  esac
done
cp "$BUSYBOX" "$STAGE/bin/busybox"
ln -s busybox "$STAGE/bin/sh"
mknod -m 600 "$STAGE/dev/console" c 5 1
mknod -m 666 "$STAGE/dev/null" c 1 3

# /tmp is a tmpfs inside the VM, which would hide a repository or build directory that lives
# under the host's /tmp (CI may clone there), and the mount point of the output share in WORK.
# Park each such top-level /tmp/<dir> on a spare
# mount point of the read-only host root before the tmpfs goes on, then move it back on top.
HOLD=""; RESTORE=""; holders=(/mnt /srv /media); nh=0; seen=" "
for p in "$REPO" "$BUILD" "$WORK"; do
  case "$p" in /tmp/?*) ;; *) continue ;; esac
  top="/tmp/$(echo "${p#/tmp/}" | cut -d/ -f1)"
  case "$seen" in *" $top "*) continue ;; esac
  [ "$nh" -lt "${#holders[@]}" ] || die "too many directories under /tmp to expose in the VM"
  h="${holders[$nh]}"; nh=$((nh + 1)); seen="$seen$top "
  HOLD="$HOLD
busybox mount -o bind /newroot$top /newroot$h || echo \"stage1: cannot hold $top\""
  RESTORE="$RESTORE
busybox mkdir -p /newroot$top && busybox mount -o move /newroot$h /newroot$top || echo \"stage1: cannot expose $top\""
done

# Stage 1 (initramfs): load modules, mount the host root read-only and the output share,
# then switch_root into the host's filesystem and run stage 2 (vm-init.sh) from there.
cat > "$STAGE/init" <<INIT
#!/bin/sh
export PATH=/bin
busybox mount -t proc proc /proc
busybox mount -t sysfs sys /sys
busybox mount -t devtmpfs dev /dev
for m in ${order[*]}; do
  busybox insmod /lib/modules/\$m.ko || echo "stage1: insmod \$m failed"
done
busybox mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose hostroot /newroot \
  || { echo "stage1: mounting the host root failed"; busybox poweroff -f; }
$HOLD
busybox mount -t tmpfs -o size=512m tmp /newroot/tmp
$RESTORE
busybox mount -t 9p -o trans=virtio,version=9p2000.L,rw kvxout /newroot$OUT \
  || { echo "stage1: mounting the output share failed"; busybox poweroff -f; }
busybox mount -t devtmpfs dev /newroot/dev
busybox mount -t proc proc /newroot/proc
busybox mount -t sysfs sys /newroot/sys
busybox mount -t tmpfs tmp /newroot/run
exec busybox switch_root /newroot /bin/bash $HERE/vm-init.sh
INIT
chmod +x "$STAGE/init"
(cd "$STAGE" && find . | "$BUSYBOX" cpio -o -H newc 2>/dev/null | gzip -1 > "$WORK/initramfs.cpio.gz")

# Stage 2 reads its job from the output share.
{
  printf 'KVX_VM_OUT=%q\nKVX_BUILD_DIR=%q\nKVX_REPO=%q\nKVX_PAYLOAD=%q\n' "$OUT" "$BUILD" "$REPO" "$PAYLOAD"
  printf 'KVX_PAYLOAD_ARGS=('; printf '%q ' "$@"; printf ')\n'
} > "$OUT/job.env"

echo "run-vm: kernel $KVER, ${#order[@]} modules, payload $PAYLOAD, build $BUILD, limit ${TIMEOUT_S}s"
start=$(date +%s)
set +e
timeout --kill-after=10 "$TIMEOUT_S" qemu-system-x86_64 \
  -accel tcg -cpu max -smp 2 -m "$MEM" -nodefaults -no-reboot \
  -display none -monitor none -serial stdio \
  -kernel "/boot/vmlinuz-$KVER" -initrd "$WORK/initramfs.cpio.gz" \
  -append "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=passthrough,readonly=on,multidevs=remap \
  -virtfs local,path="$OUT",mount_tag=kvxout,security_model=passthrough,multidevs=remap \
  </dev/null 2>&1 | tee "$WORK/console.log"
qrc=${PIPESTATUS[0]}
set -e
cp "$WORK/console.log" "$OUT/console.log" 2>/dev/null || true
echo "run-vm: VM ran $(( $(date +%s) - start ))s (qemu exit $qrc)"
if [ "$qrc" -eq 124 ] || [ "$qrc" -eq 137 ]; then
  echo "run-vm: hard time limit of ${TIMEOUT_S}s reached" >&2
  exit 124
fi
[ -f "$OUT/rc" ] || die "the payload left no exit status (VM crashed or failed to boot; see $WORK/console.log)"
rc="$(cat "$OUT/rc")"
echo "run-vm: payload exit status $rc"
exit "$rc"
