#!/bin/sh
# Layers point down only (README, "Architecture"): core < passes < graph; core < passes <
# backends/* < api. Two checks, each naming every edge that points up:
#  1. includes: every `#include "..."` under src/, resolved as the compiler does (the
#     including file's folder, then -Iinclude, then -Isrc/core), must stay in the layers the
#     including file may use:
#        core      core
#        passes    core, passes
#        graph     core, passes, graph (backends only through core's registry, backend.h)
#        backends  core, passes, backends (a backend may call another's kernels: cpu -> ref)
#        api       everything
#     include/graft.h (the public API) is usable by all.
#  2. symbols (when the objects are built; OBJDIR, default build/asan/src then build/src):
#     every symbol an object of a layer uses and graft defines must be defined in a layer it
#     may use. This catches what an include check cannot: an `extern` declaration of a
#     concrete backend in graph code, or a core function defined in the api. The two allowed
#     upward calls: the graph calls backend_register_builtin() (core/backend.h declares it) and
#     the device table calls device_discover_builtin() (core/device.h declares it); the
#     backends define both, in the one file that names the built-in backends.
# Usage: tests/check_layers.sh [OBJDIR]. Exits 1 naming each violation.
set -u
export LC_ALL=C
cd "$(dirname "$0")/.." || exit 2

layer_of() { # path relative to the repository -> layer name, or "" outside src/
  case "$1" in
    include/*) echo public ;;
    src/core/*) echo core ;;
    src/passes/*) echo passes ;;
    src/graph/*) echo graph ;;
    src/backends/*) echo backends ;;
    src/api/*) echo api ;;
    src/dist/*) echo dist ;;
    *) echo "" ;;
  esac
}

may_use() { # layer target -> 0 when allowed
  [ "$2" = public ] && return 0
  [ "$1" = "$2" ] && return 0
  case "$1:$2" in
    passes:core) return 0 ;;
    graph:core|graph:passes) return 0 ;;
    backends:core|backends:passes) return 0 ;;
    dist:core) return 0 ;;
    api:*) return 0 ;;
  esac
  return 1
}

fail=0
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT

# ---- 1. includes
for f in $(find src -name '*.c' -o -name '*.h' -o -name '*.def' | sort); do
  from=$(layer_of "$f")
  dir=$(dirname "$f")
  sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f" > "$tmp/inc"
  while IFS= read -r inc; do
    to=""
    for base in "$dir" include src/core; do
      if [ -f "$base/$inc" ]; then
        to=$(realpath --relative-to=. "$base/$inc")
        break
      fi
    done
    if [ -z "$to" ]; then
      echo "check_layers: $f includes \"$inc\", which resolves to no file" >&2
      fail=1
      continue
    fi
    tl=$(layer_of "$to")
    if ! may_use "$from" "$tl"; then
      echo "check_layers: $f ($from) includes \"$inc\" = $to ($tl): $from may not use $tl" >&2
      fail=1
    fi
  done < "$tmp/inc"
done

# ---- 2. symbols
objdir=${1:-}
if [ -z "$objdir" ]; then
  for d in build/asan/src build/src; do
    [ -d "$d/core" ] && { objdir=$d; break; }
  done
fi
if [ -n "$objdir" ] && command -v nm > /dev/null; then
  # defined symbols -> layer
  for o in $(find "$objdir" -name '*.o' | sort); do
    src=src/${o#"$objdir"/}
    l=$(layer_of "$src")
    nm -P --defined-only "$o" 2> /dev/null | awk -v l="$l" '$2 ~ /^[A-Z]$/ {print $1, l}'
  done | sort -u > "$tmp/defs"
  for o in $(find "$objdir" -name '*.o' | sort); do
    src=src/${o#"$objdir"/}
    from=$(layer_of "$src")
    nm -P -u "$o" 2> /dev/null | awk '{print $1}' | sort -u > "$tmp/undef"
    join "$tmp/undef" "$tmp/defs" | while read -r sym tl; do
      [ "$from:$sym" = "graph:backend_register_builtin" ] && continue
      [ "$from:$sym" = "core:device_discover_builtin" ] && continue
      if ! may_use "$from" "$tl"; then
        echo "check_layers: ${src%.o}.c ($from) uses $sym, defined in $tl: $from may not use $tl" >&2
        echo x >> "$tmp/symfail"
      fi
    done
  done
  [ -s "$tmp/symfail" ] && fail=1
else
  echo "check_layers: no objects built (make lib): symbol edges not checked" >&2
fi

if [ "$fail" = 0 ]; then echo "check_layers: layers point down"; fi
exit "$fail"
