#!/bin/bash
# The sampling temperature of `ludic train env`'s default, measured on the packaged model: 8 samples on each of the
# 64 held-out test instances of two instance-rich study tasks, at each temperature. The summary gives the mean
# success (= pass@1 at that temperature), pass@8, and mixed@8: the share of instances whose 8 samples neither all
# succeeded nor all failed, i.e. the GRPO groups of 8 (the default group size) that would carry a gradient.
#
#   bash examples/study/temperature.sh                results in runs/temperature/<task>-t<T>.summary.json
#   TEMPS="1.0 0.7 0.5" bash examples/study/temperature.sh
set -u
OUT=${OUT:-runs/temperature}
TEMPS=${TEMPS:-1.0 0.7}
mkdir -p "$OUT"
run() {  # task name, temperature, then flags
  name=$1; t=$2; shift 2
  ludic eval env "$@" --samples 8 --temperature "$t" --out "$OUT/$name-t$t.jsonl" > "$OUT/$name-t$t.log" 2>&1 \
    || echo "$name at temperature $t failed: see $OUT/$name-t$t.log"
}
for t in $TEMPS; do
  run chain_sum "$t" --env reasoning_gym:chain_sum \
    --env-kwargs '{"config":{"min_terms":2,"max_terms":3,"min_digits":1,"max_digits":2}}'
  run products12 "$t" --env reasoning_gym:products \
    --env-kwargs '{"config":{"min_terms":2,"max_terms":2,"min_digits":1,"max_digits":2}}'
done
grep -H "pass@" "$OUT"/*.log
