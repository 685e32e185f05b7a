#!/usr/bin/env bash
# slurm_e2e.sh - run a (tiny) config of the workflow twice from a scratch copy of this checkout:
# once with the local executor, once through `snakemake --profile slurm` against the cluster of
# .ci/slurm.sh. Passes when every non-local job went through sbatch and is COMPLETED in sacct,
# and when the SLURM run's results/ equal the local run's file for file.
#
# Usage: .ci/slurm_e2e.sh [CONFIG [TARGET...]]   (default: config/ci.yaml, the Snakefile's default target)
# Environment: KVZAP_E2E_TIMEOUT (s, default 1800) per snakemake run;
#   KVZAP_E2E_IGNORE  extended regex of results/ paths not compared (default: none);
#   KVZAP_CI_PARTITION / KVZAP_CI_ACCOUNT as given to .ci/slurm.sh (handed to the profile).
# snakemake must be on PATH (the project venv).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
config=${1:-config/ci.yaml}
shift || true
targets=("$@")
timeout_s=${KVZAP_E2E_TIMEOUT:-1800}
ignore=${KVZAP_E2E_IGNORE:-}
export KVZAP_SLURM_PARTITION=${KVZAP_CI_PARTITION:-gpu} KVZAP_SLURM_ACCOUNT=${KVZAP_CI_ACCOUNT:-kvzap}

log() { printf '[slurm_e2e %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
fail() { log "FAIL: $*"; echo "0 passed, 1 failed"; exit 1; }

# Both runs use the same absolute path, so outputs that record paths compare equal too.
scratch=$(mktemp -d /tmp/kvzap-e2e.XXXXXX)
work=$scratch/repo
mkdir -p "$work"
(cd "$repo" && git ls-files -co --exclude-standard -z | grep -zv '^results/' | tar --null --ignore-failed-read -T - -cf -) | tar -xf - -C "$work"
cd "$work"
log "scratch copy in $work; config $config; targets ${targets[*]:-(default)}"

# The user's exact command must resolve the profile from the repository root. Targets go first
# everywhere: --configfile takes several values and would swallow them.
snakemake "${targets[@]}" --profile slurm -n --configfile "$config" >"$scratch/dryrun.log" 2>&1 ||
  { tail -n 30 "$scratch/dryrun.log"; fail "snakemake --profile slurm -n"; }
grep -q '^Using profile slurm ' "$scratch/dryrun.log" || fail "dry run did not use the slurm profile"

t0=$SECONDS
timeout -k 10 "$timeout_s" snakemake "${targets[@]}" --cores 2 --configfile "$config" >"$scratch/local.log" 2>&1 ||
  { tail -n 40 "$scratch/local.log"; fail "local run"; }
log "local run: $((SECONDS - t0)) s"
mv results "$scratch/local_results"
rm -rf .snakemake

t0=$SECONDS
# Fast polling only; plain options override the profile without replacing its default-resources.
# A snakemake waiting on SLURM ignores SIGTERM, hence -k.
timeout -k 10 "$timeout_s" snakemake "${targets[@]}" --profile slurm --configfile "$config" \
  --slurm-init-seconds-before-status-checks 2 --latency-wait 5 --retries 0 >"$scratch/slurm.log" 2>&1 || { tail -n 60 "$scratch/slurm.log"; fail "SLURM run"; }
slurm_s=$((SECONDS - t0))
log "SLURM run: $slurm_s s"

run_id=$(sed -n 's/^SLURM run ID: //p' "$scratch/slurm.log" | head -1)
[[ -n $run_id ]] || fail "no 'SLURM run ID' in the log: did the slurm executor run?"
submitted=$(grep -c 'has been submitted with SLURM jobid' "$scratch/slurm.log" || true)
localrules=$(grep -c '^localrule ' "$scratch/slurm.log" || true)
total=$(awk '$1 == "total" {print $2; exit}' "$scratch/slurm.log")
sleep 2 # sacct lags slurmctld by a moment
sacct -X -n -P --name "$run_id" -S now-1day -o JobID,State,Partition,Account,AllocTRES | tee "$scratch/sacct.txt"
completed=$(cut -d'|' -f2 "$scratch/sacct.txt" | grep -cx COMPLETED || true)
log "jobs: total=$total submitted=$submitted local=$localrules completed_in_sacct=$completed"
((submitted >= 1)) || fail "no job was submitted to SLURM"
((submitted + localrules == total)) || fail "$((total - submitted - localrules)) job(s) bypassed sbatch"
((completed == submitted)) || fail "sacct shows $completed of $submitted jobs COMPLETED"
# the CI cluster's defaults are other names: these prove the profile placed the jobs
cut -d'|' -f3 "$scratch/sacct.txt" | grep -qvx "$KVZAP_SLURM_PARTITION" && fail "a job ran outside partition $KVZAP_SLURM_PARTITION"
cut -d'|' -f4 "$scratch/sacct.txt" | grep -qvx "$KVZAP_SLURM_ACCOUNT" && fail "a job ran outside account $KVZAP_SLURM_ACCOUNT"

# Same outputs: the same file list, identical contents. Only clock readings may differ: the `seconds`
# columns of CSVs, a PDF's /CreationDate and the job logs (<root>/logs/, timings and progress bars) whose
# presence is still compared; everything else, weights and shards included, byte for byte.
python - "$scratch/local_results" results "$ignore" <<'EOF_PY' || fail "the SLURM run's outputs differ from the local run's"
import re, sys
from pathlib import Path
import pandas as pd
local, slurm, ignore = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
def files(root):
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not (ignore and re.search(ignore, str(p.relative_to(root))))}
a, b = files(local), files(slurm)
bad = [f"only in the local run: {f}" for f in sorted(a - b)] + [f"only in the SLURM run: {f}" for f in sorted(b - a)]
for name in sorted(a & b):
    x, y = local / name, slurm / name
    if name.split("/")[1:2] == ["logs"]:
        same = True
    elif name.endswith(".csv"):
        dx, dy = (pd.read_csv(p).drop(columns=["seconds"], errors="ignore") for p in (x, y))
        same = dx.equals(dy)
    elif name.endswith(".pdf"):
        same = re.sub(rb"/CreationDate \(D:[^)]*\)", b"", x.read_bytes()) == re.sub(rb"/CreationDate \(D:[^)]*\)", b"", y.read_bytes())
    else:
        same = x.read_bytes() == y.read_bytes()
    if not same:
        bad.append(f"differs: {name}")
print("\n".join(bad) or f"{len(a)} output files identical")
sys.exit(1 if bad or not a else 0)
EOF_PY
log "SLURM run took $slurm_s s"

# The Snakemake report of the SLURM run: one HTML file holding every figure and table, each with its caption.
snakemake "${targets[@]}" --report "$scratch/report.html" --configfile "$config" >"$scratch/report.log" 2>&1 ||
  { tail -n 30 "$scratch/report.log"; fail "snakemake --report"; }
python - "$scratch/report.html" "$config" <<'EOF_PY' || fail "the report lacks outputs"
import sys
from pathlib import Path
import yaml
from kvzap.report.outputs import FIGURES, TABLES
html, config = Path(sys.argv[1]).read_text(), yaml.safe_load(Path(sys.argv[2]).read_text())
wanted = [f"{name}.csv" for name in TABLES] + [title.split(" {")[0] for title in TABLES.values()]
wanted += [f"{name}.png" for name in config["figures"]] + [FIGURES[f["kind"]].caption for f in config["figures"].values()]
missing = [w for w in wanted if w not in html]
print("\n".join(f"not in the report: {w}" for w in missing) or f"report: {len(wanted)} items present")
sys.exit(1 if missing else 0)
EOF_PY
rm -rf "$scratch"
echo "1 passed, 0 failed"
