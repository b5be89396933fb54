#!/bin/bash
# Tic-tac-toe from rewards alone (issue 39, docs/tictactoe.md): `ludic recipe tictactoe --teacher none` with its
# default flags, three seeds, one run at a time (two runs on 2 cores slow each other and change what a budgeted
# run learns). Each finished run's report.json, config.json, report.md and learning_curves.png are copied to
# examples/rewards_only/results/<reward>-s<seed>/ (run directories do not outlive the machine); a seed whose
# results are there already is skipped, so the script resumes.
#
#   bash examples/rewards_only/study.sh [move|outcome] [seeds...]      (default: move 0 1 2)
#   REWARD_FLAGS="--budget-minutes 57" bash examples/rewards_only/study.sh outcome 0   (the 60-minute row)
set -u
REWARD=${1:-move}
shift || true
SEEDS=${*:-0 1 2}
OUT=${OUT:-runs/rewards_only}
KEEP=examples/rewards_only/results
TAG=${TAG:-$REWARD}
mkdir -p "$OUT" "$KEEP"
for s in $SEEDS; do
  name=$TAG-s$s
  [ -f "$KEEP/$name/report.json" ] && continue
  # shellcheck disable=SC2086
  ludic recipe tictactoe --teacher none --reward "$REWARD" ${REWARD_FLAGS:-} --seed "$s" --run-dir "$OUT/$name" \
    --logger print > "$OUT/$name.log" 2>&1 || echo "$name exited $?: see $OUT/$name.log"
  if [ -f "$OUT/$name/report.json" ]; then
    mkdir -p "$KEEP/$name"
    cp "$OUT/$name"/{report.json,config.json,report.md} "$KEEP/$name/"
    cp "$OUT/$name/learning_curves.png" "$KEEP/$name/" 2>/dev/null || true
  fi
done
