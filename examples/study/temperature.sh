#!/bin/bash
# The sampling temperature of `ludic train env`'s default, measured: the packaged model's sampled success (4 samples
# on each of 64 held-out instances: mean success = pass@1 at that temperature, and pass@4) at temperature 1.0, 0.7
# and 0.5 on two instance-rich tasks. RL needs groups whose samples differ and sometimes succeed.
#
#   bash examples/study/temperature.sh        results in runs/temperature/<task>-t<T>.summary.json
set -u
OUT=${OUT:-runs/temperature}
mkdir -p "$OUT"
for t in 1.0 0.7 0.5; do
  ludic eval env --env reasoning_gym:chain_sum --env-kwargs '{"config":{"min_terms":2,"max_terms":3,"min_digits":1,"max_digits":2}}' \
    --samples 4 --temperature "$t" --out "$OUT/chain_sum-t$t.jsonl" > "$OUT/chain_sum-t$t.log" 2>&1
  ludic eval env --env reasoning_gym:letter_counting --env-kwargs '{"config":{"min_words":3,"max_words":5}}' \
    --samples 4 --temperature "$t" --out "$OUT/letter_counting-t$t.jsonl" > "$OUT/letter_counting-t$t.log" 2>&1
done
grep -H "pass@" "$OUT"/*.log
