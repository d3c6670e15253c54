#!/usr/bin/env bash
# The GPU checks, run on a machine with an NVIDIA GPU (the session's lent H200), from the
# repository root, writing what they find under $OUT (default ./var/gpu-checks):
#   1. nvidia-smi's own outputs (XML and text query, topology): recorded as fixtures for
#      the health parsers (tests/health/fixtures/h200/);
#   2. the node probe (python -m trainer probe) and describe;
#   3. collectives on NCCL (one rank: correctness and timing, busbw is 0 by the formula);
#   4. determinism in bf16 and fp32 on the GPU: the same config twice, losses bit for bit;
#      a resume from a checkpoint against the uninterrupted run, bit for bit; a restore
#      drill of a clean checkpoint (must pass) and of one damaged with valid hashes (must
#      fail).
# Needs only the image's python3 with torch (no Django). Prints a summary; exits non-zero
# when a check that must hold does not.
set -uo pipefail
OUT="${OUT:-var/gpu-checks}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/tests"
PY=python3
fail=0
step() { echo "== $*"; }

step "nvidia-smi"
nvidia-smi -q -x >"$OUT/h200-nvidia-smi-q.xml" 2>&1 || echo "nvidia-smi -q -x failed"
nvidia-smi -q >"$OUT/h200-nvidia-smi-q.txt" 2>&1 || echo "nvidia-smi -q failed"
nvidia-smi topo -m >"$OUT/h200-topo-m.txt" 2>&1 || echo "nvidia-smi topo -m failed"
nvidia-smi nvlink -s >"$OUT/h200-nvlink-s.txt" 2>&1 || echo "nvidia-smi nvlink -s failed"
nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv

step "probe and describe"
$PY -m trainer probe >"$OUT/probe.json" 2>"$OUT/probe.err"; echo "probe rc $?"
$PY -m trainer describe >"$OUT/describe.json" 2>&1; echo "describe rc $?"

step "collectives (NCCL, one rank)"
for dtype in float32 bfloat16; do
  timeout 240 $PY -m trainer collectives --device cuda --dtype "$dtype" --max-bytes 268435456 \
    --iters 20 --warmup 5 --out "$OUT/collectives-$dtype.json" >/dev/null 2>"$OUT/collectives-$dtype.err"
  rc=$?; echo "collectives $dtype rc $rc"; [ "$rc" = 0 ] || fail=1
done

step "collectives tests on NCCL (pytest, no Django conftest)"
timeout 200 $PY -m pytest -q -p no:cacheprovider --noconftest tests/trainer/test_collectives.py \
  -k "nccl or cuda" 2>&1 | tail -15

step "determinism, resume and drills on the GPU"
timeout 400 $PY bench/gpu/determinism.py "$OUT" || fail=1
echo "device checks: $([ $fail = 0 ] && echo passed || echo FAILED)"
exit $fail
