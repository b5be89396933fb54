"""GRPO on a ThinkTacToe prompt dataset with the move-quality reward (tiny model, raw prompts)."""

import json

from ludic.data.jsonl import write_jsonl
from ludic.data.text_logs import read_text_log
from ludic.tictactoe.thinktactoe import make_grpo_records
from ludic.envs.prompt_env import PromptEnv, get_reward
from ludic.recipes.grpo_prompts import TrainPromptsConfig, train_prompts
from ludic.training.config import TrainerConfig


def test_prompt_env_scores_with_named_reward():
    rec = make_grpo_records(1, seed=3)[0]
    env = PromptEnv(rec["prompt"], "move_quality")
    obs, _ = env.reset()[env.agent_id]
    assert obs == rec["prompt"]
    out = env.step({env.agent_id: rec["completion"]})[env.agent_id]
    assert out.terminated and out.reward == get_reward("move_quality")(rec["prompt"], rec["completion"]) > 0
    bad = PromptEnv(rec["prompt"], "move_quality")
    bad.reset()
    assert bad.step({bad.agent_id: "no move"})[bad.agent_id].reward == -1.0


def test_train_prompts_runs_and_writes_grpo_text_log(tiny_model_dir, tmp_path):
    data = tmp_path / "grpo.jsonl"
    write_jsonl(data, make_grpo_records(8, seed=0))
    run = tmp_path / "run"
    out = train_prompts(TrainPromptsConfig(model=str(tiny_model_dir), data=str(data), run_dir=str(run),
                                           group_size=2, prompts_per_step=2, train_steps=2,
                                           max_completion_tokens=6, logger="none",
                                           trainer=TrainerConfig(lr=1e-3)))
    assert out["num_items"] == 4
    logs = list(run.glob("grpo_training_logs_*.txt"))
    header, steps = read_text_log(logs[0])
    assert header["kind"] == "grpo" and [s for s, _ in steps] == [1, 2] and "reward_mean" in steps[0][1]
    rollouts = [json.loads(x) for x in (run / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 8 and all(r["steps"][0]["trace"]["prompt_ids"] for r in rollouts)
