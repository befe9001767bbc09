#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Stage 2 of the Soft-RoCE VM (started by tests/rxe/run-vm.sh through switch_root, as PID 1):
# bring up lo and rxe0, run the payload, record its exit status in the output share, power off.
# The root filesystem is the host's, read-only; /tmp and /run are tmpfs.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/tmp LANG=C
set -u
OUTDIR="$(awk '$1=="kvxout"{print $2}' /proc/mounts)"
# shellcheck disable=SC1091
source "$OUTDIR/job.env"
export KVX_VM_OUT KVX_BUILD_DIR KVX_REPO
finish() {
  echo "$1" > "$KVX_VM_OUT/rc"
  sync
  busybox poweroff -f
}
mkdir -p /dev/shm /dev/pts && mount -t tmpfs -o mode=1777 shm /dev/shm && mount -t devpts devpts /dev/pts
ip link set lo up
if ! rdma link add rxe0 type rxe netdev lo; then
  echo "vm-init: rdma link add rxe0 failed"; finish 125
fi
# Wait (bounded) for the port to become ACTIVE.
for _ in $(seq 1 100); do
  grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null && break
  busybox usleep 50000
done
echo "vm-init: $(nproc) CPUs, $(awk '/MemTotal/{print $2" kB"}' /proc/meminfo), rxe0 port 1 $(cat /sys/class/infiniband/rxe0/ports/1/state)"
cd "$KVX_REPO"
bash "$KVX_PAYLOAD" "${KVX_PAYLOAD_ARGS[@]}" 2>&1 | tee "$KVX_VM_OUT/payload.log"
finish "${PIPESTATUS[0]}"
