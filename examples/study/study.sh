#!/bin/bash
# The held-out study (docs/study.md): `ludic train env` with its defaults (a 30-minute budget) on the packaged
# model, every task's test and validation sets distinct instances never trained on, three training seeds per task,
# one run at a time (two runs on 2 cores slow each other and change what a budgeted run learns). Each finished
# run's summary.json and config.json are copied to examples/study/results/<task>-s<seed>/ (run directories do not
# survive the machine), with its test episodes before and after (eval_base*.jsonl.gz, eval_trained*.jsonl.gz: every reply,
# for reading and for `ludic eval rescore`), and a task's seed is skipped when its results are there already, so the script resumes.
#
#   bash examples/study/study.sh [seeds...]           (default: 0 1 2; each task runs all its seeds before the next task)
#   TASKS="chain_sum products12" bash examples/study/study.sh 1     (only these tasks; unknown names are an error)
#   EXTRA="--prompts-per-step 8" KEEP=examples/study/results_defaults/p8 OUT=runs/study_p8 \
#     TASKS=products12 bash examples/study/study.sh 2     (a default changed: the same tasks with these flags added,
#                                                          kept apart from the study's results)
set -u
SEEDS=${*:-0 1 2}
ALL_TASKS="chain_sum gcd99 gem_guess_random gem_guess_legal indian_poker1 calculator basic_arith2 products12"
TASKS=${TASKS:-$ALL_TASKS}
for t in $TASKS; do
  case " $ALL_TASKS " in *" $t "*) ;; *) echo "unknown task '$t' in TASKS; the tasks are: $ALL_TASKS" >&2; exit 2;; esac
done
OUT=${OUT:-runs/study}
KEEP=${KEEP:-examples/study/results}
EXTRA=${EXTRA:-}
mkdir -p "$OUT" "$KEEP"
train() {  # task, seed, then ludic train env flags
  name=$1; s=$2; shift 2
  [ -f "$KEEP/$name-s$s/summary.json" ] && return
  # shellcheck disable=SC2086  # EXTRA is a list of flags
  ludic train env "$@" $EXTRA --seed "$s" --run-dir "$OUT/$name-s$s" --logger print > "$OUT/$name-s$s.log" 2>&1
  code=$?
  [ $code -eq 0 ] || echo "$name seed $s exited $code: see $OUT/$name-s$s.log"
  if [ -f "$OUT/$name-s$s/summary.json" ]; then
    mkdir -p "$KEEP/$name-s$s"
    cp "$OUT/$name-s$s/summary.json" "$OUT/$name-s$s/config.json" "$KEEP/$name-s$s/"
    for f in "$OUT/$name-s$s"/eval_base*.jsonl "$OUT/$name-s$s"/eval_trained*.jsonl; do
      [ -f "$f" ] && gzip -9c "$f" > "$KEEP/$name-s$s/$(basename "$f").gz"
    done
  fi
}
task() {  # task name, then flags: every seed of it (when TASKS names it)
  name=$1; shift
  case " $TASKS " in *" $name "*) ;; *) return;; esac
  for s in $SEEDS; do train "$name" "$s" "$@"; done
}
# reasoning-gym, instance-rich configs where the base model scores 5-70% and no constant answer scores much
# (examples/study/screen.sh; docs/study.md). letter_counting with 3-5 words is not here: 59% of its questions have
# the answer 1, and seed 0 "learned" 70.3% by answering 1 to everything (kept in results/ as that finding).
task chain_sum --env reasoning_gym:chain_sum --env-kwargs '{"config":{"min_terms":2,"max_terms":3,"min_digits":1,"max_digits":2}}'
task gcd99 --env reasoning_gym:gcd --env-kwargs '{"config":{"min_value":2,"max_value":99}}'
# GEM guess-the-number with a random range and secret per instance; a 10-step format cold start of random
# in-range guesses inside \boxed{} (the format, no strategy); its dialog trains as one sequence
# (gem_guess_random: the first config, kept as its record; it did not learn. Its teacher then saw only the last
# observation and repeated guesses, and GEM pays a lost game by its last guess's distance to the secret, so its
# policies repeated one middle guess all game.) gem_guess_legal: the teacher guesses legally (in range, never
# twice) and the reward is the win only (GEM's env kwarg handled by Ludic: {"reward": "success"})
task gem_guess_random --env gem:game:GuessTheNumber-v0-random --max-completion-tokens 24 \
  --format-demos examples.study.teachers:gem_guess
task gem_guess_legal --env gem:game:GuessTheNumber-v0-random --env-kwargs '{"reward": "success"}' \
  --max-completion-tokens 24 --format-demos examples.study.teachers:gem_guess
# a two-player game with thousands of deals, against the frozen start; evaluated against every opponent
task indian_poker1 --env textarena:IndianPoker-v0 --env-kwargs '{"max_rounds": 1}' --opponent frozen \
  --max-completion-tokens 24
# RL from a good policy: the calculator tool after a cold start that shows its use (must not lose it). The
# default cold start (10 steps at 2e-4 over the 64 teacher turns) left it at 0%; 64 steps at 5e-4 gave 81.2%
task calculator --env dataset_qa --env-kwargs '{"source": "arith", "grader": "numeric"}' \
  --tools ludic.envs.qa:calculator --format-demos examples.study.teachers:calculator --max-completion-tokens 48 \
  --format-demo-steps 64 --format-demo-lr 5e-4
# more instance-rich arithmetic with a low constant-answer score (5% and 8%), for a third reasoning task whose
# gains cannot come from the answers' base rate
task basic_arith2 --env reasoning_gym:basic_arithmetic --env-kwargs '{"config":{"min_terms":2,"max_terms":2,"min_digits":1,"max_digits":2}}'
task products12 --env reasoning_gym:products --env-kwargs '{"config":{"min_terms":2,"max_terms":2,"min_digits":1,"max_digits":2}}'
