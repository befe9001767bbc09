# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures. The package is imported from the install, or from src/ after
`setup.py build_ext --inplace` (scripts/test.sh builds it so)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
SRC = os.path.join(os.path.dirname(HERE), "src")
if os.path.isdir(SRC) and SRC not in sys.path:
    sys.path.insert(0, SRC)

# Hang bound for anything that crosses the loopback on a loaded 2-core machine (seconds).
HANG_S = float(os.environ.get("KVX_PY_HANG_S", "60"))
