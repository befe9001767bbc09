#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Smoke payload for tests/rxe/run-vm.sh: rxe0 is listed and perftest WRITE runs over it.
set -euo pipefail
ibv_devices
ibv_devinfo -d rxe0 | grep -E 'state|active_mtu|link_layer'
ib_write_bw -d rxe0 -x 1 -s 65536 -n 200 -F >/tmp/srv.log 2>&1 &
srv=$!
for _ in $(seq 1 50); do
  ib_write_bw -d rxe0 -x 1 -s 65536 -n 200 -F 127.0.0.1 && ok=1 && break
  busybox usleep 100000
done
wait "$srv"
[ "${ok:-0}" = 1 ]
