#!/usr/bin/env bash
# Reproduce docs/paper-findings.md: GSPO vs GRPO vs GRPO + Routing Replay on the tiny MoE,
# 3 seeds each, plus the stress setting (3 seeds each), then `gspo compare` of each group.
# Every run starts from ONE shared cold-start checkpoint (`gspo sft`, seed 0), so seeds vary
# the RL only and no run repeats the SFT. Two runs at a time, one torch thread each (2 cores:
# ~30 min). Runs land in $RUNS (default runs/paper); comparisons in docs/paper-findings/.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-runs/paper}
SEEDS=${SEEDS:-"1 2 3"}
GSPO=${GSPO:-.venv/bin/gspo}
export OMP_NUM_THREADS=1
mkdir -p "$RUNS"
COLD="$RUNS/cold-start"
if [[ ! -f $COLD/cold_start/config.json ]]; then
  rm -rf "$COLD"
  "$GSPO" sft recipes/paper/moe-base.yaml --out "$COLD" --set trainer.seed=0 \
    --set logging.console=plain >"$COLD.log" 2>&1 || { echo "FAILED: cold start" >&2; exit 1; }
fi
SHARED=(--set "model.path=$(realpath "$COLD")/cold_start" --set cold_start.enabled=false)

jobs=()
for recipe in gspo grpo grpo-routing-replay; do
  for seed in $SEEDS; do jobs+=("$recipe $seed"); done
done
for recipe in stress-gspo stress-grpo stress-grpo-rr; do
  for seed in $SEEDS; do jobs+=("$recipe $seed"); done
done

run_one() {  # recipe seed: skipped when finished, resumed when cut short
  local recipe=$1 seed=$2 out="$RUNS/$1-s$2"
  if [[ -f $out/summary.json ]]; then return 0; fi
  local resume=()
  if [[ -d $out ]]; then resume=(--resume); fi
  "$GSPO" train "recipes/paper/$recipe.yaml" --out "$out" --set "trainer.seed=$seed" \
    "${SHARED[@]}" --set logging.console=plain "${resume[@]}" >"$out.log" 2>&1 \
    || { echo "FAILED: $recipe seed $seed (see $out.log)" >&2; return 1; }
  echo "done: $recipe seed $seed"
}

running=0
for job in "${jobs[@]}"; do
  # shellcheck disable=SC2086
  run_one $job &
  running=$((running + 1))
  if ((running == 2)); then wait -n; running=$((running - 1)); fi
done
wait

main_runs=()
for recipe in gspo grpo grpo-routing-replay; do
  for seed in $SEEDS; do main_runs+=("$RUNS/$recipe-s$seed"); done
done
"$GSPO" compare "${main_runs[@]}" --group-seeds --out docs/paper-findings/main --smooth 5
stress_runs=()
for recipe in stress-gspo stress-grpo stress-grpo-rr; do
  for seed in $SEEDS; do stress_runs+=("$RUNS/$recipe-s$seed"); done
done
"$GSPO" compare "${stress_runs[@]}" --group-seeds --out docs/paper-findings/stress --smooth 5
