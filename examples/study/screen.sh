#!/bin/bash
# The screen behind the held-out study (docs/study.md): the packaged model's greedy success on 64 distinct
# held-out test instances of each candidate task (`ludic eval env`, which also measures the task's instance
# space), to pick tasks with thousands of instances or more where the base model scores 5-70%.
#
#   bash examples/study/screen.sh            results in runs/screen/<task>.log (the last lines: success, instances)
set -u
OUT=${OUT:-runs/screen}
mkdir -p "$OUT"
screen() {  # name, then ludic eval env flags
  name=$1; shift
  [ -f "$OUT/$name.log" ] && grep -q "^instances:" "$OUT/$name.log" && return
  ludic eval env "$@" --episodes 64 --out "$OUT/$name.jsonl" > "$OUT/$name.log" 2>&1 || echo "$name failed: see $OUT/$name.log"
  echo "$name: $(grep -E '^(reasoning_gym|textarena|gem)' "$OUT/$name.log" | head -1 | cut -c1-160)"
}
screen chain_sum --env reasoning_gym:chain_sum --env-kwargs '{"config":{"min_terms":2,"max_terms":3,"min_digits":1,"max_digits":2}}'
screen letter_counting --env reasoning_gym:letter_counting --env-kwargs '{"config":{"min_words":3,"max_words":5}}'
screen gcd99 --env reasoning_gym:gcd --env-kwargs '{"config":{"min_value":2,"max_value":99}}'
screen products12 --env reasoning_gym:products --env-kwargs '{"config":{"min_terms":2,"max_terms":2,"min_digits":1,"max_digits":2}}'
screen basic_arith2 --env reasoning_gym:basic_arithmetic --env-kwargs '{"config":{"min_terms":2,"max_terms":2,"min_digits":1,"max_digits":2}}'
screen count_bits --env reasoning_gym:count_bits
screen lcm50 --env reasoning_gym:lcm --env-kwargs '{"config":{"min_value":2,"max_value":50}}'
screen leg_counting --env reasoning_gym:leg_counting --env-kwargs '{"config":{"min_animals":1,"max_animals":2}}'
screen gem_guess_random --env gem:game:GuessTheNumber-v0-random --max-completion-tokens 24
screen indian_poker1 --env textarena:IndianPoker-v0 --env-kwargs '{"max_rounds": 1}' --max-completion-tokens 24
