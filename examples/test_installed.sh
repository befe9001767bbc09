#!/usr/bin/env bash
# ctest example_installed_pkgconfig: install this build into a temporary prefix, build
# examples/kv_loopback.c out of tree with only `pkg-config kvxfer` (shared, then static
# libkvxfer.a with `pkg-config --static`), check what each binary links, and run both.
# usage: test_installed.sh BUILD_DIR EXAMPLE.c [EXTRA_CFLAGS]
set -euo pipefail
build=$1 src=$2 san_flags=${3:-}
cc=${CC:-cc}
tmp=$(mktemp -d /tmp/kvx_install_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "test_installed: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install failed"; }
pc=$(find "$tmp/prefix" -name kvxfer.pc -path '*/pkgconfig/*')
[ -n "$pc" ] || fail "no kvxfer.pc installed under $tmp/prefix"
export PKG_CONFIG_PATH=$(dirname "$pc")
[ -f "$tmp/prefix/include/kvxfer.h" ] || fail "include/kvxfer.h not installed"
libdir=$(pkg-config --variable=libdir kvxfer)
libdir=$(cd "$libdir" && pwd -P)
case "$libdir" in "$(cd "$tmp" && pwd -P)"/*) ;; *) fail "pkg-config libdir $libdir is not inside the install prefix";; esac
[ -f "$libdir/libkvxfer.a" ] || fail "libkvxfer.a not in $libdir"
ls "$libdir"/libkvxfer.so* >/dev/null || fail "libkvxfer.so not in $libdir"
pkg-config --exists --print-errors kvxfer || fail "pkg-config kvxfer"
# Every function the installed headers declare KVX_API is exported by libkvxfer.so, and nothing else.
inc=$(pkg-config --variable=includedir kvxfer)
grep -hv "^[[:space:]]*#" "$inc/kvxfer.h" "$inc"/kvxfer/*.h | tr '\n' ' ' | grep -oE 'KVX_API[^;{(]*\(' |
	sed -E 's/.*[ *]([A-Za-z_0-9]+) *\($/\1/' | sort -u >"$tmp/api.txt"
nm -D --defined-only "$libdir/libkvxfer.so" | awk '$2 == "T" || $2 == "W" {print $3}' | sort -u >"$tmp/exported.txt"
missing=$(comm -23 "$tmp/api.txt" "$tmp/exported.txt" | tr '\n' ' ')
[ -z "$missing" ] || fail "declared KVX_API but not exported by libkvxfer.so: $missing"
unexpected=$(comm -13 "$tmp/api.txt" "$tmp/exported.txt" | tr '\n' ' ')
[ -z "$unexpected" ] || fail "exported by libkvxfer.so but not declared KVX_API in the installed headers: $unexpected"
[ "$(wc -l <"$tmp/api.txt")" -gt 100 ] || fail "found only $(wc -l <"$tmp/api.txt") KVX_API functions in $inc"
# The in-tree tier (include/kvxfer/internal/) stays out of the install, and every installed header
# compiles on its own without it.
[ ! -e "$inc/kvxfer/internal" ] || fail "include/kvxfer/internal/ was installed"
for h in "$inc/kvxfer.h" "$inc"/kvxfer/*.h; do
	case "$h" in */ring_impl.h) continue;; esac # not for direct inclusion (kvxfer/ring.h)
	printf '#include "%s"\n' "${h#"$inc/"}" >"$tmp/hdr.c"
	# shellcheck disable=SC2046
	$cc -std=c11 -Wall -Wextra -Werror -fsyntax-only $(pkg-config --cflags kvxfer) "$tmp/hdr.c" \
		|| fail "installed header ${h#"$inc/"} does not compile on its own"
done

cd "$tmp"
cp "$src" example.c
# Shared: exactly the command the README gives.
# shellcheck disable=SC2046,SC2086
$cc -std=c11 -Wall -Wextra -Werror $san_flags -o ex_shared example.c $(pkg-config --cflags --libs kvxfer) \
	|| fail "out-of-tree build against libkvxfer.so failed"
resolved=$(LD_LIBRARY_PATH="$libdir" ldd ./ex_shared | awk '/libkvxfer\.so/ {print $3}')
[ "$(cd "$(dirname "$resolved")" && pwd -P)" = "$libdir" ] || fail "ex_shared loads libkvxfer from '$resolved', not $libdir"
LD_LIBRARY_PATH="$libdir" ./ex_shared tcp || fail "ex_shared (libkvxfer.so) exited $?"

# Static: libkvxfer.a plus what kvxfer.pc declares for static linking: its own Libs.private, and
# the Requires.private modules (linked as the distribution ships them: Debian's static .pc chain
# of libzmq/rdma-core names archives it does not ship, so the modules' shared libraries are used).
own=$(pkg-config --static --maximum-traverse-depth=2 --libs kvxfer)
case " $own " in *" -lkvxfer "*) ;; *) fail "pkg-config --static --libs kvxfer lacks -lkvxfer: '$own'";; esac
own=$(printf '%s\n' "$own" | sed -e 's/\(^\| \)-lkvxfer\( \|$\)/ /')
reqs=$(pkg-config --print-requires-private kvxfer)
# shellcheck disable=SC2046,SC2086
$cc -std=c11 -Wall -Wextra -Werror $san_flags -o ex_static example.c $(pkg-config --cflags kvxfer) \
	"$libdir/libkvxfer.a" $own $(pkg-config --libs $reqs) \
	|| fail "out-of-tree build against libkvxfer.a with kvxfer.pc's Libs.private + Requires.private failed"
if readelf -d ex_static | grep -q 'libkvxfer'; then fail "ex_static still needs libkvxfer.so"; fi
./ex_static tcp || fail "ex_static (libkvxfer.a) exited $?"
echo "test_installed: OK (prefix $tmp/prefix, $(pkg-config --modversion kvxfer), shared and static)"
