#!/bin/bash
# pass@k of the base model and of a trained adapter on one study task's held-out test instances (issue 40):
# 8 samples per question at the training temperature, then the trained samples rescored with a stricter reward
# (examples/study/rewards.py: the <answer> tag required) without generating again.
#
#   bash examples/study/passk.sh [adapter]     (default: runs/study/chain_sum-s0/final)
set -eu
ADAPTER=${1:-runs/study/chain_sum-s0/final}
OUT=${OUT:-runs/passk}
T=${T:-1.0}
mkdir -p "$OUT"
ENV=(--env reasoning_gym:chain_sum --env-kwargs '{"config":{"min_terms":2,"max_terms":3,"min_digits":1,"max_digits":2}}')
ludic eval env "${ENV[@]}" --samples 8 --temperature "$T" --out "$OUT/base.jsonl" 2>&1 | grep -v "^\[eval"
ludic eval env "${ENV[@]}" --samples 8 --temperature "$T" --adapter "$ADAPTER" --out "$OUT/trained.jsonl" 2>&1 \
  | grep -v "^\[eval"
for f in base trained; do
  PYTHONPATH=. ludic eval rescore "$OUT/$f.jsonl" --reward examples.study.rewards:tagged 2>&1 | tail -4
done
