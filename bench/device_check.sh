#!/bin/sh
# bench/device_check.sh [HWCHECK FLAGS...]: everything to run on a lent GPU machine, in one go, bounded to 8 minutes.
#
#   1. nvidia-smi                  (30 s)   what the driver says         -> $OUT/nvidia-smi.txt
#   2. python -m agent.nvml_check  (60 s)   what NVML says, changing nothing -> $OUT/nvml_check.json
#   3. python -m agent.hwcheck     (360 s)  the node end to end through an agent, --timeout 300
#                                           -> $OUT/hwcheck.json (the report) and $OUT/hwcheck.txt (its lines)
#
# Read-only for the device by default; flags after the script name go to hwcheck (e.g. --mps, or
# --allow-mig-changes on a machine whose MIG layout may be changed). It never resets a GPU.
# OUT defaults to var/device-check. PYTHON defaults to .venv/bin/python, else python3: it needs the agent's
# dependencies (aiohttp, nvidia-ml-py; torch for the CUDA load, else that check is a SKIP).
# Exit status: 0 when every step passed, else the first failing step's (hwcheck: 1 = a check failed).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-var/device-check}
mkdir -p "$OUT"
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
status=0

timeout 30 nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
rc=$?; echo "nvidia-smi: exit $rc"; [ $status -eq 0 ] && status=$rc

timeout 60 "$PYTHON" -m agent.nvml_check > "$OUT/nvml_check.json" 2> "$OUT/nvml_check.err"
rc=$?; echo "agent.nvml_check: exit $rc"; [ $status -eq 0 ] && status=$rc

timeout -k 10 360 "$PYTHON" -m agent.hwcheck --backend nvml --timeout 300 --json "$OUT/hwcheck.json" "$@" \
    > "$OUT/hwcheck.txt" 2>&1
rc=$?; echo "agent.hwcheck: exit $rc"; [ $status -eq 0 ] && status=$rc
cat "$OUT/hwcheck.txt"
echo "reports in $OUT"
exit $status
