#!/usr/bin/env bash
# Build the GPU box's offline kit into .gpu-kit/ (git-ignored): what its image lacks for
# bench/gpu_box.py, to carry with the working tree (64 MiB in all, tree included).
#
#   bash bench/gpu_kit/prepare.sh            # here, with network (PyPI and the Debian mirror)
#   then, in a session with a device:  run(command="bash bench/gpu_kit/run.sh", carry=[".gpu-kit"], timeout_s=600)
#
# The box: Python 3.12 with torch 2.11 (CUDA), numpy, scipy, pillow, pyyaml, psutil, tqdm,
# tensorboard and more; no network. The kit holds
#   wheels/  Python 3.12 manylinux wheels, at the versions requirements.lock pins, of the packages
#            the box lacks (pip download --no-deps --only-binary=:all:); antlr4-python3-runtime has
#            no wheel on PyPI: pip wheel builds it here (pure Python);
#   debs/    Debian amd64 packages (apt-get download): the GL loaders nav3d renders through (EGL,
#            glvnd) and the freetype/fontconfig libraries pyglet's font module loads;
#   MANIFEST.txt  what is in it, the lock's sha256, its size.
# The list follows ../shared/gpu-kit's working recipe (2026-11-27, one H100), plus cloudpickle
# (gymnasium and tensordict require it; 22 KB, in case the image lacks it). Mujoco and Ray are
# left out (no row uses them; Ray alone is over the limit).
# Env: KIT (default <repo>/.gpu-kit), PY (a pip-capable Python; default .venv/bin/python).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
KIT=${KIT:-$ROOT/.gpu-kit}
PY=${PY:-$ROOT/.venv/bin/python}
LOCK=$ROOT/requirements.lock
LIMIT=$((64 * 1024 * 1024))  # bytes: the device call carries the tree and the kit up to this

WHEELS=(hydra-core omegaconf gymnasium Farama-Notifications minigrid miniworld pyglet pygame-ce
  tensordict pyvers cloudpickle lz4 pettingzoo mpe2)
BUILT=(antlr4-python3-runtime)  # no wheel on PyPI: built here
GL_DEBS=(libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 libvulkan1)
FONT_DEBS=(libfreetype6 libpng16-16 libbrotli1 libfontconfig1 fontconfig-config fonts-dejavu-core)

die() { echo "prepare.sh: error: $*" >&2; exit 1; }

pinned() { # the version requirements.lock pins for a name (compared as PEP 503 normalises)
  local want
  want=$(echo "$1" | tr 'A-Z_.' 'a-z--')
  awk -F'==' -v want="$want" '{ k = tolower($1); gsub(/[-_.]+/, "-", k); if (k == want) print $2 }' "$LOCK"
}

[ -f "$LOCK" ] || die "no requirements.lock at $LOCK"
"$PY" -m pip --version >/dev/null 2>&1 || die "PY=$PY has no pip (set PY=...)"
command -v apt-get >/dev/null || die "apt-get not found: the Debian packages come from apt-get download"

TMP=$(mktemp -d -t gpu-kit.XXXXXX)  # outside the tree: not counted in it
LOG=$TMP.log                        # pip's and apt's own output, shown when one fails
trap 'rm -rf "$TMP" "$LOG"' EXIT
mkdir -p "$TMP/wheels" "$TMP/debs"
fail() { tail -20 "$LOG" >&2; die "$@"; }

for name in "${WHEELS[@]}" "${BUILT[@]}"; do
  version=$(pinned "$name")
  [ -n "$version" ] || die "$name is not pinned in requirements.lock"
  echo "$name==$version"
done >"$TMP/pins.txt"

echo "wheels (Python 3.12, manylinux x86_64) ..."
for name in "${WHEELS[@]}"; do
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$TMP/wheels" "$name==$(pinned "$name")" >>"$LOG" 2>&1 ||
    fail "pip download $name==$(pinned "$name") failed (no Python 3.12 manylinux wheel?)"
done
for name in "${BUILT[@]}"; do
  "$PY" -m pip wheel --quiet --no-deps -w "$TMP/wheels" "$name==$(pinned "$name")" >>"$LOG" 2>&1 ||
    fail "pip wheel $name==$(pinned "$name") failed"
done
for whl in "$TMP"/wheels/*.whl; do # a built wheel must be pure Python (any Python 3 takes it)
  case $(basename "$whl") in
    *-cp312-*manylinux* | *-abi3-*manylinux* | *-py3-none-any.whl | *-py2.py3-none-any.whl) ;;
    *) die "$(basename "$whl") is neither pure Python nor a cp312 manylinux wheel" ;;
  esac
done

echo "Debian packages (amd64) ..."
(cd "$TMP/debs" && apt-get download "${GL_DEBS[@]/%/:amd64}" "${FONT_DEBS[@]/%/:amd64}" >>"$LOG" 2>&1) ||
  fail "apt-get download failed (run apt-get update first?)"
# run.sh tells the two apart: GL loaders may go to / (the recipe's fallback), fonts never.
mkdir -p "$TMP/debs/gl" "$TMP/debs/fonts"
for name in "${GL_DEBS[@]}"; do mv "$TMP/debs/${name}"_*.deb "$TMP/debs/gl/"; done
for name in "${FONT_DEBS[@]}"; do mv "$TMP/debs/${name}"_*.deb "$TMP/debs/fonts/"; done

kit_bytes=$(du -sb "$TMP" | cut -f1)
tree_bytes=$(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
  xargs -0 -r stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
total=$((kit_bytes + tree_bytes))
{
  echo "# GPU-box kit, built $(date -Iseconds) by bench/gpu_kit/prepare.sh"
  echo "lock_sha256 $(sha256sum "$LOCK" | cut -d' ' -f1)"
  echo "kit_bytes $kit_bytes"
  echo "tree_bytes $tree_bytes"
  echo "# pins"
  cat "$TMP/pins.txt"
  echo "# files"
  (cd "$TMP" && find wheels debs -type f -printf '%s %p\n' | sort -k2)
} >"$TMP/MANIFEST.txt"
rm "$TMP/pins.txt"
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "kit $(mib "$kit_bytes") + working tree $(mib "$tree_bytes") = $(mib "$total") (limit 64 MiB)"
[ "$total" -le "$LIMIT" ] || die "over the 64 MiB a device call carries: leave something out"

rm -rf "$KIT"
mv "$TMP" "$KIT"
echo "kit ready: $KIT ($(ls "$KIT"/wheels | wc -l) wheels, $(find "$KIT"/debs -name '*.deb' | wc -l) Debian packages)"
