#!/usr/bin/env bash
# rehearsal.sh - config/paper.yaml rehearsed end to end through `snakemake --profile slurm`: the three paper models
# as tiny random models with their real architectures and tokenizers, every method, benchmark, table and figure,
# from an offline Hub cache (tests/rehearsal/build.py). Passes when every table and every figure file exists and
# every job went through sbatch (the cluster of .ci/slurm.sh must be up).
#
# Usage: .ci/rehearsal.sh [--local]   (--local: snakemake --cores 2 instead of the SLURM profile)
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf '[rehearsal %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
fail() { log "FAIL: $*"; echo "0 passed, 1 failed"; exit 1; }

hub=$(mktemp -d /tmp/kvzap-hub.XXXXXX)
trap 'rm -rf "$hub"' EXIT
PYTHONPATH=$PWD python -m tests.rehearsal.build --cache "$hub" >&2
export HF_HUB_CACHE=$hub HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_DATASETS_CACHE=$hub/datasets \
  KVZAP_DUO_PATTERNS=$hub/duo-attention-patterns
export KVZAP_SLURM_PARTITION=${KVZAP_CI_PARTITION:-gpu} KVZAP_SLURM_ACCOUNT=${KVZAP_CI_ACCOUNT:-kvzap}
rm -rf results/rehearsal

t0=$SECONDS
if [[ ${1:-} == --local ]]; then
  snakemake all --cores 2 --configfile config/rehearsal.yaml >"$hub/run.log" 2>&1 || { tail -n 60 "$hub/run.log"; fail "local run"; }
else
  snakemake all --profile slurm --configfile config/rehearsal.yaml --slurm-init-seconds-before-status-checks 2 \
    --latency-wait 5 --retries 0 >"$hub/run.log" 2>&1 || { tail -n 80 "$hub/run.log"; fail "SLURM run"; }
  total=$(awk '$1 == "total" {print $2; exit}' "$hub/run.log")
  submitted=$(grep -c 'has been submitted with SLURM jobid' "$hub/run.log" || true)
  localrules=$(grep -c '^localrule ' "$hub/run.log" || true)
  log "jobs: total=$total submitted=$submitted local=$localrules"
  ((submitted + localrules == total)) || fail "$((total - submitted - localrules)) job(s) bypassed sbatch"
fi
log "run: $((SECONDS - t0)) s"

# Every table and figure of the paper config, by name.
python - <<'EOF_PY' || fail "missing outputs"
import sys
from pathlib import Path
import yaml
config = yaml.safe_load(Path("config/rehearsal.yaml").read_text())
root = Path(config["results"])
expected = [root / "tables" / f for f in ("results.csv", "results.md", "surrogates.csv", "best.csv", "provenance.json")]
expected += [root / "figures" / f"{name}.{ext}" for name in config["figures"] for ext in ("png", "pdf")]
missing = [str(p) for p in expected if not p.is_file() or p.stat().st_size == 0]
for p in expected:
    print(("MISSING " if str(p) in missing else "ok      ") + str(p))
sys.exit(1 if missing else 0)
EOF_PY
echo "1 passed, 0 failed"
