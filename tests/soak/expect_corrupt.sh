#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# ctest soak_checker_detects_corruption: run kvx-soak with --corrupt-every (every Nth request
# carries another request's bytes, the consumer scribbles into a block it freed) and require
# that the soak fails (exit 1) and reports both kinds of corruption. Usage: expect_corrupt.sh
# KVX_SOAK [ARGS...]
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out" | grep '^kvx-soak: \(seed\|first\)'
if [ "$rc" -ne 1 ]; then
  echo "expect_corrupt: kvx-soak exited $rc, want 1 (corruption found)"
  exit 1
fi
if ! printf '%s\n' "$out" | grep -Eq 'corrupt=[1-9][0-9]* \(foreign-writes=[1-9]' ||
   ! printf '%s\n' "$out" | grep -q '^kvx-soak: CORRUPT soak-'; then
  echo "expect_corrupt: the summary does not report both wrong DONE bytes and foreign writes"
  exit 1
fi
echo "expect_corrupt: the checker caught the planted corruption"
