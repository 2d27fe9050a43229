#!/usr/bin/env bash
# The one prepared call of a lent GPU machine (issue 38; ../shared/GPU.md, "The time there is"). From
# the device tool:   run(command="bash benchmarks/gpu_call.sh", carry=[".dev/whl"], timeout_s=540)
#
# 1. installs the wheels the box lacks (.dev/whl from ../shared/tools/gpu-box-wheels.sh) into /tmp/site,
#    once per warm machine, and DALI when earlier calls brought its parts to /tmp/dali (GPU.md);
# 2. registers the Jupyter kernel the grader starts;
# 3. runs `python3 -m course_utils.gpu_check --pending --budget $BUDGET` (default 480 s): the stages in
#    the order of course_utils/gpu_check.STAGES, each stage's results written into $OUT/gpu-check as it
#    finishes, so what ran comes back even when the call is cut short. The report of this warm
#    machine's earlier calls (kept in /tmp/gpu-check) is copied in first, so --pending goes on from it.
# Extra arguments go to gpu_check (e.g. `--stage graphs,ladder`).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build}
SITE=/tmp/site
KEEP=/tmp/gpu-check
t0=$(date +%s)
if [ -d .dev/whl ] && [ ! -f "$SITE/.installed" ]; then
  python3 -m pip install -q --no-index --no-deps --target "$SITE" .dev/whl/*.whl && touch "$SITE/.installed"
fi
# .dev/whl/extra: packages a box may or may not have (tornado was missing on the 2026-11-27 H200):
# each installed only where its import fails, so the box's own builds are never shadowed.
if [ -d .dev/whl/extra ] && [ ! -f "$SITE/.extra" ]; then
  for whl in .dev/whl/extra/*.whl; do
    name=$(basename "$whl" | sed 's/-[0-9].*//')
    case "$name" in
      ansicolors) mod=colors ;; attrs) mod=attr ;; python_dateutil) mod=dateutil ;; pyyaml) mod=yaml ;;
      *) mod=$name ;;
    esac
    PYTHONPATH="$SITE" python3 -c "import $mod" 2>/dev/null \
      || python3 -m pip install -q --no-index --no-deps --target "$SITE" "$whl" 2>&1 | grep -v "already exists" | tail -2
  done
  touch "$SITE/.extra"
fi
if ls /tmp/dali/part-* >/dev/null 2>&1 && [ ! -f "$SITE/.dali" ]; then
  (cd /tmp/dali && cat part-* | tar -x && python3 -m pip install -q --no-index --no-deps --target "$SITE" ./*.whl) \
    && touch "$SITE/.dali"
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -z "${GPU_CALL_NO_KERNEL:-}" ]; then    # (its test sets it: no kernel spec written on a CI machine)
  python3 -m ipykernel install --user >/dev/null 2>&1 || echo "gpu_call: could not register the python3 kernel"
fi
mkdir -p "$OUT/gpu-check" "$KEEP"
# GPU_CALL_FRESH=1: forget the earlier calls' report, so stages they ran (and failed) run again (--pending skips them)
[ -n "${GPU_CALL_FRESH:-}" ] && rm -rf "${KEEP:?}"/* 
cp -r "$KEEP/." "$OUT/gpu-check/" 2>/dev/null
spent=$(( $(date +%s) - t0 ))
budget=$(( ${BUDGET:-480} - spent ))
echo "gpu_call: set up in ${spent} s; gpu_check gets ${budget} s"
python3 -m course_utils.gpu_check --out "$OUT/gpu-check" --pending --budget "$budget" "$@"
status=$?
cp -r "$OUT/gpu-check/." "$KEEP/"
exit $status
