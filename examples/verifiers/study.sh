#!/bin/bash
# Issue 40's packaged-model runs, one at a time (two runs on 2 cores slow each other and change what a budgeted
# run learns): the verifiers single-turn env (vf_sums), the multi-turn one (vf_retry), each `ludic train env` with
# its defaults and a budget, and the newcomer's tool env trained by `ludic.train(KeyEnv, tools=[lookup])`
# (examples/own_env/lookup_tool.py). Each run's summary.json and config.json are kept in
# examples/verifiers/results/<name>/; a run whose summary is there already is skipped.
#
#   bash examples/verifiers/study.sh [minutes, default 10]
set -u
MIN=${1:-10}
OUT=${OUT:-runs/first_hour}
KEEP=examples/verifiers/results
mkdir -p "$OUT" "$KEEP"
export PYTHONPATH=examples/verifiers${PYTHONPATH:+:$PYTHONPATH}
keep() {  # name, run dir
  if [ -f "$2/summary.json" ]; then
    mkdir -p "$KEEP/$1" && cp "$2"/{summary.json,config.json} "$KEEP/$1/" 2>/dev/null
  else
    echo "$1: no summary.json in $2 (see $OUT/$1.log)"
  fi
}
# vf_retry: three replies of the default 64 tokens made one step take 128 s and a 10-minute run one step; the
# answer is a number, so its replies are capped at 16 tokens and it gets 15 minutes
for run in "vf_sums|" "vf_retry|--max-completion-tokens 16 --budget-minutes 15"; do
  env=${run%%|*} flags=${run#*|}
  [ -f "$KEEP/$env/summary.json" ] && continue
  # shellcheck disable=SC2086
  ludic train env --env "verifiers:$env" --budget-minutes "$MIN" $flags --run-dir "$OUT/$env" --logger print \
    > "$OUT/$env.log" 2>&1 || echo "$env exited $?: see $OUT/$env.log"
  keep "$env" "$OUT/$env"
done
if [ ! -f "$KEEP/lookup_tool/summary.json" ]; then
  python examples/own_env/lookup_tool.py "$MIN" > "$OUT/lookup_tool.log" 2>&1 || echo "lookup_tool exited $?"
  run=$(sed -n 's/^run: //p' "$OUT/lookup_tool.log" | tail -1)
  [ -n "$run" ] && keep lookup_tool "$run"
fi
