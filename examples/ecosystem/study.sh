#!/bin/bash
# The five-task study of the README ("RL with the defaults on tasks we did not write"): `ludic train env`
# with its defaults on the packaged model (full lr 2e-4 steps, keep-best on 32 validation episodes every 5
# steps), three training seeds per task, one run at a time (two runs on 2 cores slow each other and change
# the wall times). Then: python examples/ecosystem/table.py runs/study_v3 --larger runs/study_v3/eval256
#
#   bash examples/ecosystem/study.sh [seeds...]      (default: 0 1 2)
set -u
SEEDS=${*:-0 1 2}
OUT=${OUT:-runs/study_v3}
train() {  # name, then ludic train env flags
  name=$1; shift
  for s in $SEEDS; do
    [ -f "$OUT/$name-s$s/summary.json" ] && continue
    ludic train env "$@" --seed "$s" --run-dir "$OUT/$name-s$s" --logger print > "$OUT/$name-s$s.log" 2>&1 ||
      echo "$name seed $s failed: see $OUT/$name-s$s.log"
  done
}
# The same held-out evaluation on 256 episodes (base, then each seed's adapter), for tasks cheap enough to
# evaluate longer: table.py --larger "$OUT/eval256" reads it
eval256() {  # name, then ludic eval env flags
  name=$1; shift
  mkdir -p "$OUT/eval256"
  for s in base $SEEDS; do
    if [ "$s" = base ]; then tag=base; adapter=(); else tag=s$s; adapter=(--adapter "$OUT/$name-s$s/final"); fi
    out="$OUT/eval256/$name-$tag"
    [ -f "$out.jsonl" ] && continue
    [ "$s" = base ] || [ -d "$OUT/$name-s$s/final" ] || continue
    ludic eval env "$@" "${adapter[@]}" --episodes 256 --out "$out.jsonl" > "$out.log" 2>&1 ||
      echo "$name eval256 $s failed: see $out.log"
  done
}
mkdir -p "$OUT"
# reasoning-gym: sizes where the base model scores between about 5% and 70%
CHAIN=(--env reasoning_gym:chain_sum --env-kwargs '{"config":{"min_terms":2,"max_terms":3,"min_digits":1,"max_digits":2}}')
train chain_sum "${CHAIN[@]}"
eval256 chain_sum "${CHAIN[@]}"
train gcd --env reasoning_gym:gcd --env-kwargs '{"config":{"min_value":2,"max_value":40}}'
# from the second screen (after gcd moved within noise under every default): products learned, lcm less
train products --env reasoning_gym:products --env-kwargs '{"config":{"min_terms":2,"max_terms":2,"min_digits":1,"max_digits":1}}'
train lcm --env reasoning_gym:lcm --env-kwargs '{"config":{"min_value":2,"max_value":20}}'
# TextArena: a one-player game (its own partial-credit reward; a guess is "[n]", so replies stop at 24 tokens:
# at the default 64 a step took 100-120 s, the model filling each of up to 10 turns) and a two-player one
# against the frozen start (one round: three rounds played alike at about 7x the time)
# Its observations are what each turn added, in a dialog ({"observations": "new"}): a game then trains as
# one sequence instead of one item per turn each re-reading the history (3.65x fewer tokens at 5.7
# turns, benchmarks/bench_multiturn.py --workload textarena); the base model scores the same either way (4.7%)
train ta_guess --env textarena:GuessTheNumber-v0 --env-kwargs '{"observations": "new"}' --max-completion-tokens 24
KUHN=(--env textarena:KuhnPoker-v0 --env-kwargs '{"max_rounds": 1}' --opponent frozen)
train ta_kuhn1 "${KUHN[@]}"
eval256 ta_kuhn1 "${KUHN[@]}"
# GEM (Gymnasium API): its guesses count only inside \boxed{}, which the base model never writes, so a
# 10-step format cold start from example replies (random in-range guesses: the format, no strategy) runs first
train gem_guess --env gem:game:GuessTheNumber-v0-easy --format-demos examples/ecosystem/boxed_guesses.txt
