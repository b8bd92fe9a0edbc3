#!/usr/bin/env bash
# The GPU suite in one command, for a GPU machine that may have no network (issue 26):
#
#   bash scripts/gpu-check.sh [WHEELS]     # WHEELS: a folder of wheels to install first
#   bash scripts/gpu-check.sh --fetch DIR  # (where pip works) download those wheels for a
#                                          # CUDA image's Python 3.12 into DIR
#
# It expects a Python with a CUDA build of torch (a cloud GPU image's; $PYTHON, else python3).
# What such an image lacks of spotnb's runtime (pydantic and its parts, blake3) is installed
# from WHEELS with --no-index into a folder of its own, never into the image's Python. Then it
# runs the `gpu` tests (tests/gpu), the GPU checkpoint benchmark at 2 GB (stall and throughput)
# and 10 GB (stall), and prints one summary. Each part has its own time limit, so that one
# slow part still leaves the others' figures (each measurement is printed as it is made); the
# whole takes under 9 minutes on one H100/H200 (on an H200: tests 74 s, 2 GB ~135 s, 10 GB: SGD ~110 s,
# and AdamW did not fit the 160 s it once had, hence 270 s).
# Everything it writes goes to $GPU_CHECK_OUT (default: a fresh temporary folder).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WANT=(pydantic==2.14.3 pydantic_core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5
  typing_extensions==4.16.0 blake3==1.0.11)

if [[ "${1:-}" == "--fetch" ]]; then
  dir=${2:?usage: gpu-check.sh --fetch DIR}
  exec "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$dir" "${WANT[@]}"
fi

WHEELS=${1:-${SPOTNB_WHEELS:-}}
OUT=${GPU_CHECK_OUT:-$(mktemp -d -t spotnb-gpu-check-XXXX)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu-check: $PY has no CUDA device (torch.cuda.is_available() is False): nothing to check" >&2
  exit 2
fi
if [[ -n "$WHEELS" ]]; then
  SITE=$(mktemp -d -t spotnb-gpu-site-XXXX)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$WHEELS"/*.whl || { echo "gpu-check: could not install the wheels in $WHEELS" >&2; exit 2; }
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! "$PY" -c 'import spotnb, spotnb.runtime.agent' 2>"$OUT/import.err"; then
  tail -3 "$OUT/import.err" >&2
  echo "gpu-check: spotnb cannot be imported here; fetch its wheels where pip works:" >&2
  echo "  bash scripts/gpu-check.sh --fetch wheels/   # then: bash scripts/gpu-check.sh wheels/" >&2
  exit 2
fi
export SPOTNB_GPU_REPORT="$OUT/report.jsonl"
: >"$SPOTNB_GPU_REPORT"
"$PY" -c 'import torch; print("gpu-check:", torch.cuda.get_device_name(0), "x", torch.cuda.device_count(), "| torch", torch.__version__, "| CUDA", torch.version.cuda)' | tee "$OUT/device.txt"

echo "== the gpu tests"
timeout -k 10 150 "$PY" -m pytest tests/gpu tests/runtime/checkpoint/test_gated_snapshot.py -p no:cacheprovider -q \
  -o addopts="" --timeout 140 --junitxml "$OUT/tests.xml" -r fEs 2>&1 | tee "$OUT/tests.log"
echo "== the checkpoint benchmark, 2 GB (stall and throughput)"
timeout -k 10 150 "$PY" benchmarks/bench_checkpoint.py --device cuda --mb 2000 --rounds 2 --steps 30 \
  --json "$OUT/bench-2gb.json" 2>&1 | grep -v "Warning\|return func" | tee "$OUT/bench-2gb.log"
echo "== the checkpoint benchmark, 10 GB (stall)"
timeout -k 10 270 "$PY" benchmarks/bench_checkpoint.py --device cuda --mb 10000 --rounds 1 --stall-only \
  --json "$OUT/bench-10gb.json" 2>&1 | grep -v "Warning\|return func" | tee "$OUT/bench-10gb.log"
"$PY" scripts/gpu_summary.py "$OUT"
