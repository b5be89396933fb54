"""How many of the old any-environment study's test episodes were trained instances (issue 38's must-show), counted
by the new reporting (``ludic.eval.instances``): for each task of that study, its 64 test seeds (10^9 ..) as it
drew them, their distinct instances, the instance space (Chao1 over probed training seeds), how many test
instances occur among the training split's probed instances, and how many a 30-step run of 4 seeds a step
(seed 0, as ``ludic train env`` drew them then: ``random.Random(0).randrange(10^9)``) trained on.

    python examples/study/old_overlap.py [--probe 20000] [--only products,ta_kuhn1]
"""

import argparse
import json
import random

from ludic.eval.instances import estimate_space
from ludic.recipes.env_setup import EVAL_SEED_BASE, EnvConfig, instance_key_fn

OLD = {  # the rows of the old table: (env, env_kwargs)
    "products": ("reasoning_gym:products", {"config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}),
    "gcd": ("reasoning_gym:gcd", {"config": {"min_value": 2, "max_value": 40}}),
    "lcm": ("reasoning_gym:lcm", {"config": {"min_value": 2, "max_value": 20}}),
    "chain_sum": ("reasoning_gym:chain_sum", {"config": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}}),
    "gem_guess": ("gem:game:GuessTheNumber-v0-easy", {}),
    "ta_guess": ("textarena:GuessTheNumber-v0", {"observations": "new"}),
    "ta_kuhn1": ("textarena:KuhnPoker-v0", {"max_rounds": 1}),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", type=int, default=20000, help="training seeds reset to map the training split")
    ap.add_argument("--only", default="", help="comma list of tasks (default: all)")
    args = ap.parse_args()
    rows = []
    only = [t for t in args.only.split(",") if t]
    for name, (env, kw) in OLD.items():
        if only and name not in only:
            continue
        opts = EnvConfig(env=env, env_kwargs=json.dumps(kw))
        test_key, train_key = instance_key_fn(opts, "eval"), instance_key_fn(opts, "train")
        test = [test_key(EVAL_SEED_BASE + i) for i in range(64)]
        rng = random.Random(12345)
        probed = [train_key(rng.randrange(EVAL_SEED_BASE)) for _ in range(args.probe)]
        space = estimate_space(probed)
        old_rng = random.Random(0)
        trained = {train_key(old_rng.randrange(EVAL_SEED_BASE)) for _ in range(30 * 4)}
        distinct = set(test)
        rows.append({"task": name, "test_episodes": len(test), "test_distinct": len(distinct),
                     "space": space["estimate"], "space_exact": space["exact"],
                     "test_in_training_split": len(distinct & set(probed)),
                     "test_trained_by_30_steps": len(distinct & trained)})
        print(json.dumps(rows[-1]), flush=True)
    print("\n| task | test episodes | distinct test instances | instance space | of them in the training split "
          "(probed) | trained on by a 30-step run (seed 0) |\n|---|---|---|---|---|---|")
    for r in rows:
        space = f"{r['space']}{'' if r['space_exact'] else ' (est.)'}"
        print(f"| {r['task']} | {r['test_episodes']} | {r['test_distinct']} | {space} | {r['test_in_training_split']} | "
              f"{r['test_trained_by_30_steps']} |")


if __name__ == "__main__":
    main()
