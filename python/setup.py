# SPDX-License-Identifier: Apache-2.0
"""Build kvxfer's C extension (limited API, abi3) against libkvxfer.

Where libkvxfer comes from, first match wins:
  1. env KVXFER_BUILD_DIR: a CMake build tree of this repository (links its libkvxfer.a);
  2. ../build next to this directory (the README's default build tree);
  3. an installed kvxfer found by pkg-config (`cmake --install build --prefix P`, then
     PKG_CONFIG_PATH=P/lib/pkgconfig).
The static archive is linked in, so the extension needs only libzmq, msgpack, liburcu, numa
(and amdhip64 in a HIP build) at run time. Env KVXFER_EXT_CFLAGS / KVXFER_EXT_LDFLAGS add
flags (the ASan run in scripts/python-asan.sh uses them).
"""
import os
import re
import shlex
import subprocess
from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).resolve().parent
LIMITED = 0x030A0000  # CPython 3.10: PyUnicode_AsUTF8AndSize is in the limited API from there


def pkg_config(*args: str) -> list[str]:
    out = subprocess.run(["pkg-config", *args], check=True, capture_output=True, text=True).stdout
    return shlex.split(out)


def pc_field(pc: Path, name: str) -> str:
    m = re.search(rf"^{name}:(.*)$", pc.read_text(), re.M)
    return m.group(1).strip() if m else ""


def locate() -> tuple[list[str], list[str], list[str]]:
    """(include dirs, extra objects, link args)."""
    build = os.environ.get("KVXFER_BUILD_DIR") or str(HERE.parent / "build")
    b = Path(build)
    if (b / "libkvxfer.a").exists() and (b / "kvxfer.pc").exists():
        req = pc_field(b / "kvxfer.pc", "Requires.private").split()
        libs = pkg_config("--libs", *req) + shlex.split(pc_field(b / "kvxfer.pc", "Libs.private"))
        return [str(HERE.parent / "include")], [str(b / "libkvxfer.a")], libs
    if os.environ.get("KVXFER_BUILD_DIR"):
        raise SystemExit(f"KVXFER_BUILD_DIR={build}: no libkvxfer.a / kvxfer.pc (build it with CMake first)")
    try:
        cflags = pkg_config("--cflags", "kvxfer")
        libs = pkg_config("--static", "--libs", "kvxfer")
    except (OSError, subprocess.CalledProcessError):
        raise SystemExit("kvxfer not found: build it first (cmake -S . -B build && cmake --build build) "
                         "or install it and set PKG_CONFIG_PATH")
    incs = [f[2:] for f in cflags if f.startswith("-I")]
    return incs, [], libs


incs, objs, libs = locate()
ext = Extension(
    "kvxfer._kvxfer",
    sources=["src/kvxfer/_kvxfer.c", "src/kvxfer/ext_args.c", "src/kvxfer/ext_pump.c",
             "src/kvxfer/ext_notifier.c"],
    depends=["src/kvxfer/ext.h"],
    include_dirs=incs,
    extra_objects=objs,
    # the static libkvxfer stays private to the extension (exports only PyInit__kvxfer)
    extra_link_args=libs + ["-Wl,--exclude-libs,ALL"] + shlex.split(os.environ.get("KVXFER_EXT_LDFLAGS", "")),
    extra_compile_args=["-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-missing-field-initializers",
                        "-Wmissing-prototypes", "-fvisibility=hidden"]
    + shlex.split(os.environ.get("KVXFER_EXT_CFLAGS", "")),
    define_macros=[("Py_LIMITED_API", hex(LIMITED))],
    py_limited_api=True,
)
setup(ext_modules=[ext], options={"bdist_wheel": {"py_limited_api": "cp310"}})
