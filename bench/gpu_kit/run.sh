#!/usr/bin/env bash
# The GPU-box benchmark (bench/gpu_box.py) on the offline GPU machine, in one device call:
#
#   run(command="bash bench/gpu_kit/run.sh", carry=[".gpu-kit"], timeout_s=600)
#
# Build the kit here first (bash bench/gpu_kit/prepare.sh). On the box this script
#   1. installs the kit's wheels into a temporary site folder (pip --target, no index, no deps)
#      when the interpreter is Python 3.12 (another Python uses its own packages: a dry run);
#   2. unpacks the kit's Debian packages (GL loaders, freetype and fontconfig) into a temporary
#      root with dpkg -x, nothing written to /;
#   3. exports PYTHONPATH (the site folder, the repository), LD_LIBRARY_PATH (the unpacked
#      libraries; pyglet searches it too), FONTCONFIG_FILE, and __EGL_VENDOR_LIBRARY_FILENAMES
#      and VK_DRIVER_FILES (NVIDIA's, where the driver put them);
#   4. checks the environment (torch, CUDA, the imports, pyglet's EGL renderer) into setup.log;
#      if rendering fails there (NVIDIA's EGL vendor file present, torch and rl imported) and
#      this is root, falls back to the recipe that worked (../shared/gpu-kit: the GL packages
#      unpacked over / and ldconfig) and checks again;
#   5. runs python bench/gpu_box.py --out <folder> with this script's arguments.
# Everything lands in $OUT/gpu_box (the device call's returned folder) or, without $OUT, in
# outputs/bench/gpu_box/<time>. Env: PY (the interpreter; default python3), KIT (default
# <repo>/.gpu-kit). A dry run here: PY=.venv/bin/python bash bench/gpu_kit/run.sh --cpu-dry-run
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
KIT=${KIT:-$ROOT/.gpu-kit}
PY=${PY:-python3}
if [ -n "${OUT:-}" ]; then
  RESULT=$OUT/gpu_box
else
  RESULT=$ROOT/outputs/bench/gpu_box/$(date +%Y-%m-%d_%H-%M-%S)
fi
mkdir -p "$RESULT"
SETUP=$RESULT/setup.log
T0=$(date +%s)
say() { echo "[run.sh $(($(date +%s) - T0))s] $*" | tee -a "$SETUP"; }

[ -d "$KIT/wheels" ] && [ -d "$KIT/debs" ] ||
  { say "error: no kit at $KIT (build it with bash bench/gpu_kit/prepare.sh; carry .gpu-kit)"; exit 2; }
if [ -f "$KIT/MANIFEST.txt" ]; then
  built=$(awk '$1 == "lock_sha256" { print $2 }' "$KIT/MANIFEST.txt")
  [ "$built" = "$(sha256sum requirements.lock | cut -d' ' -f1)" ] ||
    say "warning: requirements.lock changed since the kit was built (rebuild it: bash bench/gpu_kit/prepare.sh)"
fi
STAGE=$(mktemp -d -t gpu-kit-site.XXXXXX)
SITE=$STAGE/site
LIBROOT=$STAGE/root

# 1. Wheels: cp312 manylinux and pure-Python ones, for the box's Python 3.12 only.
PYVER=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")') ||
  { say "error: no Python at PY=$PY"; exit 2; }
if [ "$PYVER" = 3.12 ]; then
  say "installing $(ls "$KIT"/wheels/*.whl | wc -l) wheels into $SITE"
  "$PY" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir \
    --target "$SITE" "$KIT"/wheels/*.whl >>"$SETUP" 2>&1 || say "warning: pip install failed (see setup.log)"
else
  say "Python $PYVER is not the box's 3.12: its own packages are used, the wheels are not installed"
fi

# 2. Debian packages into a temporary root (dpkg -x only unpacks: no scripts, nothing in /).
mkdir -p "$LIBROOT"
for deb in "$KIT"/debs/gl/*.deb "$KIT"/debs/fonts/*.deb; do
  dpkg -x "$deb" "$LIBROOT" >>"$SETUP" 2>&1 || say "warning: dpkg -x $(basename "$deb") failed"
done

# 3. The environment.
export PYTHONPATH=$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}
export LD_LIBRARY_PATH=$LIBROOT/usr/lib/x86_64-linux-gnu:$LIBROOT/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export FONTCONFIG_FILE=$LIBROOT/etc/fonts/fonts.conf
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled HYDRA_FULL_ERROR=1
first() { for f in "$@"; do [ -f "$f" ] && { echo "$f"; return; }; done; }
egl=$(first /usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json \
  /usr/share/glvnd/egl_vendor.d/10_nvidia.json /etc/glvnd/egl_vendor.d/10_nvidia.json)
vk=$(first /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json \
  /usr/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json)
[ -n "$egl" ] && export __EGL_VENDOR_LIBRARY_FILENAMES=$egl
[ -n "$vk" ] && export VK_DRIVER_FILES=$vk
{
  echo "PYTHONPATH=$PYTHONPATH"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "__EGL_VENDOR_LIBRARY_FILENAMES=${__EGL_VENDOR_LIBRARY_FILENAMES:-(unset: no NVIDIA EGL vendor file found)}"
  echo "VK_DRIVER_FILES=${VK_DRIVER_FILES:-(unset)}"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  echo "nproc $(nproc)"
} >>"$SETUP" 2>&1

# 4. The environment check (from a file: worker processes re-import __main__).
CHECK=$STAGE/check_env.py
cat >"$CHECK" <<'EOF'
"""What bench/gpu_box.py needs: torch (and CUDA), the kit's imports, pyglet's EGL renderer."""
import importlib
import sys

import torch

print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0))
# rl.tasks.nav3d_world first: it puts pyglet in headless (EGL) mode before miniworld loads it.
for name in ("hydra", "omegaconf", "gymnasium", "tensordict", "minigrid", "rl",
             "rl.tasks.nav3d_world", "miniworld", "pyglet"):
    module = importlib.import_module(name)
    print("import", name, getattr(module, "__version__", ""), getattr(module, "__file__", ""))
from pyglet import gl  # noqa: E402

import rl.tasks  # noqa: E402

print("GL_RENDERER", gl.gl_info.get_renderer(), "|", gl.gl_info.get_vendor())
env = rl.tasks.PointNav3DEnv(rooms=[1, 2], room_size=[3.0, 4.0], width=40, height=30, depth=True)
env.reset(seed=0)  # a MiniWorld scene: pyglet's font module loads freetype and fontconfig here
obs = env.step(2)[0]
print("nav3d step", {k: tuple(v.shape) for k, v in obs.items()})
env.close()
with open("/proc/self/maps") as maps:  # which copies of the GL and font libraries were loaded
    paths = {line.split()[-1] for line in maps if "/lib" in line}
for path in sorted(p for p in paths if any(k in p for k in ("EGL", "GLdispatch", "freetype"))):
    print("loaded", path)
EOF
check() { timeout 120 "$PY" "$CHECK" >>"$SETUP" 2>&1; }
say "checking the environment"
if ! check; then
  # Only on the box (NVIDIA's EGL vendor file found), as root, and only when rendering is what
  # failed (torch and rl imported): never over / of another machine.
  if [ -n "$egl" ] && [ "$(id -u)" = 0 ] && grep -q "^import rl " "$SETUP"; then
    say "the check failed: the recipe's fallback (GL packages unpacked over /, ldconfig)"
    for deb in "$KIT"/debs/gl/*.deb; do dpkg -x "$deb" / >>"$SETUP" 2>&1; done
    ldconfig >>"$SETUP" 2>&1
    check || say "warning: the check still fails (see setup.log); the rows that need it will say why"
  else
    say "warning: the check failed (see setup.log); the rows that need it will say why"
  fi
fi
grep -E "^(python|device|GL_RENDERER)" "$SETUP" | tail -3 | while read -r line; do say "$line"; done

# 5. The benchmark.
say "python bench/gpu_box.py --out $RESULT $*"
"$PY" bench/gpu_box.py --out "$RESULT" "$@"
code=$?
say "gpu_box.py exit $code; table: $RESULT/table.md"
rm -rf "$STAGE"
exit $code
