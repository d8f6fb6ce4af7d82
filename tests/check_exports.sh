#!/bin/sh
# The ABI of libgraft.so is exactly the public C API: every symbol the library exports must be
# declared in include/graft.h, and every function graft.h declares must be exported.
#   sh tests/check_exports.sh [build/libgraft.so] [include/graft.h]
# Run by `make check-abi` (part of `make test`).
set -eu
LIB=${1:-build/libgraft.so}
HDR=${2:-include/graft.h}
CC=${CC:-cc}
[ -f "$LIB" ] || { echo "check_exports: $LIB not found (make lib)" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# Exported (dynamic, defined) symbols. Symbols the linker itself may add are not the library's.
nm -D --defined-only "$LIB" | awk 'NF >= 3 { print $3 }' | sed 's/@.*//' \
  | grep -Ev '^(_init|_fini|_edata|_end|__bss_start)$' | sort -u > "$TMP/exported"

# Functions graft.h declares: `graft_name(` in the header with its comments stripped
# (-fpreprocessed: comments only, no includes or macro expansion).
"$CC" -fpreprocessed -dD -E -P -x c "$HDR" 2>/dev/null \
  | grep -oE '\bgraft_[A-Za-z0-9_]+[[:space:]]*\(' | sed 's/[[:space:]]*($//' | sort -u > "$TMP/declared"
[ -s "$TMP/declared" ] || { echo "check_exports: found no declarations in $HDR" >&2; exit 2; }

extra=$(comm -23 "$TMP/exported" "$TMP/declared")
missing=$(comm -13 "$TMP/exported" "$TMP/declared")
status=0
if [ -n "$extra" ]; then
  echo "check_exports: $LIB exports $(echo "$extra" | wc -l) symbols not declared in $HDR:"
  echo "$extra" | sed 's/^/  /'
  status=1
fi
if [ -n "$missing" ]; then
  echo "check_exports: $HDR declares $(echo "$missing" | wc -l) functions $LIB does not export:"
  echo "$missing" | sed 's/^/  /'
  status=1
fi
[ $status -eq 0 ] && echo "check_exports: $LIB exports exactly the $(wc -l < "$TMP/declared") functions of $HDR"
exit $status
