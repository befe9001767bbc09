# SPDX-License-Identifier: Apache-2.0
"""Shared settings. kvxfer is imported from an install if one is importable, else from src/
after `setup.py build_ext --inplace`."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
try:  # an installed kvxfer (scripts/test-python.sh installs it and sets PYTHONPATH) ...
    import kvxfer  # noqa: F401
except ImportError:  # ... else the source tree after `setup.py build_ext --inplace`
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

# Hang bound for anything that crosses the loopback on a loaded 2-core machine (seconds).
HANG_S = float(os.environ.get("KVX_PY_HANG_S", "60"))
