#!/usr/bin/env bash
# The GPU suite in one command: install onebox from this working tree, run the CUDA tests, then
# `onebox bench gpu` (src/onebox/bench/gpu.py says what it measures), within 9 minutes in all,
# writing one markdown report, OUT/report.md, with logs beside it. The report is rewritten as
# each part ends; a part's rows are printed ("row: | ... |", in OUT/bench.log) as each is
# measured, so a suite cut off in the middle of a part loses none of them.
#
#   benchmarks/gpu.sh OUT [options of `onebox bench gpu`, e.g. --parts envs train]
#
# How it installs:
# - Offline, from a wheelhouse: the folder .whl at the repository root (or $ONEBOX_WHEELHOUSE).
#   This workplace's lent GPU machines reach no package index; their python3 (3.12) has torch
#   with CUDA, numpy, rich, matplotlib, tensorboard, imageio, pytest, cmake and ninja. Build the
#   wheelhouse where pip reaches PyPI, once:
#       python benchmarks/gpu_wheelhouse.py .whl
#   (.gitignore ignores it) and carry it: run(command="bash benchmarks/gpu.sh $OUT/gpu", carry=[".whl"]). Its wheels go
#   into a fresh folder put first on PYTHONPATH; onebox is built there from this tree (its
#   MuJoCo envs left out: the suite needs none) with the scikit-build-core and nanobind of the
#   wheelhouse. If that build fails, the onebox wheel gpu_wheelhouse.py built is installed
#   instead, and the report says so at its top.
# - Online (no wheelhouse: a bare machine with Python, pip and the NVIDIA driver): a venv gets
#   `pip install ".[atari,bench,test]"` (PyPI's Linux torch wheels carry CUDA).
#
# Time: the install takes a minute or two, the CUDA tests about as long; the benchmarks then run
# with a deadline of the script's start + 9 minutes, the learning run last with what is left.
# ONEBOX_GPU_SECONDS (default 540) moves that deadline. The learning run to a Pong score of 20
# wants more than what is left; give it a command of its own:
#   ONEBOX_GPU_TESTS=0 ONEBOX_GPU_SECONDS=570 benchmarks/gpu.sh OUT2 --parts learn
# On a machine with no GPU, `benchmarks/gpu.sh OUT --tiny --device cpu` is a dry run at tiny
# sizes; the report says it ran on the CPU. ONEBOX_GPU_PYTHON=path skips the install and uses
# that interpreter as it is (a dry run with an installed onebox).
set -euo pipefail

if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
  echo "usage: benchmarks/gpu.sh OUT [options of onebox bench gpu]" >&2
  exit 2
fi
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
START=$(date +%s)
DEADLINE=$((START + ${ONEBOX_GPU_SECONDS:-540}))  # the suite's end, in all
WHEELS=${ONEBOX_WHEELHOUSE:-$ROOT/.whl}
export PYTHONUNBUFFERED=1
note() { echo "[gpu.sh $(($(date +%s) - START)) s] $*"; }

# ---- install ----------------------------------------------------------------------------------
if [ -n "${ONEBOX_GPU_PYTHON:-}" ]; then
  PY=$ONEBOX_GPU_PYTHON
  note "using $PY as it is (ONEBOX_GPU_PYTHON): no install"
elif [ -d "$WHEELS" ]; then
  PY=python3
  SITE=$(mktemp -d /tmp/onebox-gpu-site.XXXXXX)
  note "offline install from $WHEELS into $SITE (log: $OUT/install.log)"
  others=$(find "$WHEELS" -type f -name '*.whl' ! -name 'onebox-*')
  # shellcheck disable=SC2086
  $PY -m pip install --no-index --no-deps --no-compile --target "$SITE" $others >"$OUT/install.log" 2>&1
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
  export PATH=$SITE/bin:$PATH
  if ! command -v c++ >/dev/null; then
    echo "no C++ compiler (c++) on this machine: onebox's engine cannot be built here" >>"$OUT/install.log"
  fi
  if ! CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) $PY -m pip install --no-index --no-deps --no-build-isolation --upgrade \
      --no-compile --target "$SITE" "$ROOT" >>"$OUT/install.log" 2>&1; then
    prebuilt=$(find "$WHEELS" -type f -name 'onebox-*.whl' | head -1)
    if [ -z "$prebuilt" ]; then
      note "building onebox failed and the wheelhouse has no onebox wheel; see $OUT/install.log"
      tail -20 "$OUT/install.log"
      exit 1
    fi
    $PY -m pip install --no-index --no-deps --no-compile --upgrade --target "$SITE" "$prebuilt" >>"$OUT/install.log" 2>&1
    echo "onebox was NOT built from this tree (the build failed, see install.log): it is the wheel" \
      "$(basename "$prebuilt") that gpu_wheelhouse.py built ($(cat "$WHEELS/ONEBOX_COMMIT" 2>/dev/null || echo 'commit unknown'))." \
      >"$OUT/warning.txt"
    note "$(cat "$OUT/warning.txt")"
  fi
else
  VENV=$(mktemp -d /tmp/onebox-gpu-venv.XXXXXX)
  note "online install into the venv $VENV (log: $OUT/install.log)"
  python3 -m venv "$VENV"
  PY=$VENV/bin/python
  $PY -m pip install -q --upgrade pip >"$OUT/install.log" 2>&1
  $PY -m pip install "$ROOT[atari,bench,test]" >>"$OUT/install.log" 2>&1
fi
cd "$ROOT"  # the tests import the installed onebox: this tree's src/ is not on the path
$PY -c "import onebox._engine, torch; print('onebox', onebox.__file__, '| torch', torch.__version__, '| CUDA', torch.cuda.is_available())" | tee -a "$OUT/install.log"
note "installed"

# ---- the CUDA tests ----------------------------------------------------------------------------
# -m cuda selects them; without a GPU they are skipped (and the report shows it).
# ONEBOX_GPU_TESTS=0 leaves them out (a second command that only runs the learning run).
if [ "${ONEBOX_GPU_TESTS:-1}" = 0 ]; then
  echo "CUDA tests left out (ONEBOX_GPU_TESTS=0)" >"$OUT/cuda-tests.txt"
else
set +e
timeout 240 $PY -m pytest -m cuda tests/test_accel.py tests/test_noise.py tests/test_evo_atari.py -q -p no:cacheprovider >"$OUT/cuda-tests.log" 2>&1
code=$?
set -e
{ echo "pytest -m cuda tests/test_accel.py tests/test_noise.py tests/test_evo_atari.py (exit code $code):"; tail -n 15 "$OUT/cuda-tests.log"; } >"$OUT/cuda-tests.txt"
note "CUDA tests: exit code $code ($(tail -n 1 "$OUT/cuda-tests.log"))"
fi

# ---- the benchmarks ----------------------------------------------------------------------------
args=(--out "$OUT" --deadline "$DEADLINE" --tests "$OUT/cuda-tests.txt")
[ -f "$OUT/warning.txt" ] && args+=(--warning "$OUT/warning.txt")
$PY -m onebox bench gpu "${args[@]}" "$@" 2>&1 | tee "$OUT/bench.log"
note "done: $OUT/report.md"
