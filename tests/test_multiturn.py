"""Multi-turn episodes as training data: one sequence per episode when the context is append-only,
per-turn items otherwise, and in both cases every episode counts once in the loss."""

import pytest

from ludic.agents.agent import Agent
from ludic.context import FullDialog, LastObservationContext
from ludic.inference.client import SamplingParams
from ludic.envs.base import SingleAgentEnv
from ludic.interaction import SingleAgentProtocol
from ludic.rollouts.batch import build_saw_items
from ludic.rollouts.credit import MonteCarloReturn
from ludic.training.algorithms import make_algorithm
from ludic.training.lora import load_policy
from ludic.training.trainer import Trainer, TrainerConfig
from ludic.types import SAWItem, StepOutcome


class CountEnv(SingleAgentEnv):
    """Three turns; turn k pays reward k + 1."""

    def env_reset(self, seed=None):
        self.turn = 0
        return "Turn 0. Say a word.", {}

    def env_step(self, action):
        self.turn += 1
        return StepOutcome(f"Turn {self.turn}. Another word.", float(self.turn), terminated=self.turn == 3)


async def _episode(scripted, tokenizer, ctx):
    client = scripted(["one", "two words", "three"], tokenizer)
    client.policy_version = 4
    agent = Agent(client, ctx)
    [r] = await SingleAgentProtocol(agent).run(CountEnv(), max_steps=5, env_seed=0)
    assert len(r.steps) == 3
    r.meta["group_id"] = "g"
    return r


async def test_append_only_episode_is_one_sequence_with_masked_glue(scripted, tokenizer):
    r = await _episode(scripted, tokenizer, FullDialog("Be brief."))
    [item] = build_saw_items([r], MonteCarloReturn())
    first, last = r.steps[0].trace, r.steps[-1].trace
    assert item.prompt_ids == first.prompt_ids
    assert item.prompt_ids + item.completion_ids == last.prompt_ids + last.completion_ids
    assert item.episode_share == 1.0 and item.meta["turns"] == 3
    mask = item.action_mask
    assert mask is not None and len(mask) == len(item.completion_ids)
    trained = [t for t, m in zip(item.completion_ids, mask) if m]
    assert trained == [t for s in r.steps for t in s.trace.completion_ids]
    assert 0 < mask.count(0) == len(item.completion_ids) - len(trained)  # template + env text between turns
    # each sampled token carries its own step's credit, sampler log-prob and policy version
    returns = {0: 6.0, 1: 5.0, 2: 3.0}  # reward-to-go of rewards 1, 2, 3
    expect_w = [returns[s.index] for s in r.steps for _ in s.trace.completion_ids]
    assert [w for w, m in zip(item.token_weights, mask) if m] == expect_w
    assert [lp for lp, m in zip(item.logprobs, mask) if m] == [x for s in r.steps for x in s.trace.logprobs]
    assert item.min_policy_version == 4
    assert item.num_action_tokens == len(trained)


async def test_rewritten_context_keeps_one_item_per_turn_sharing_the_episode(scripted, tokenizer):
    r = await _episode(scripted, tokenizer, LastObservationContext("Be brief."))
    items = build_saw_items([r], MonteCarloReturn())
    assert len(items) == 3
    assert [it.episode_share for it in items] == pytest.approx([1 / 3] * 3)
    assert [it.weight for it in items] == [6.0, 5.0, 3.0]
    assert all(it.action_mask is None for it in items)


async def test_merging_can_be_turned_off(scripted, tokenizer):
    r = await _episode(scripted, tokenizer, FullDialog("Be brief."))
    items = build_saw_items([r], MonteCarloReturn(), merge_turns=False)
    assert len(items) == 3 and sum(it.episode_share for it in items) == pytest.approx(1.0)


@pytest.mark.parametrize("aggregation", ["sequence", "sum", "constant"])
def test_each_episode_counts_once_whatever_its_turn_count(tiny_model_dir, aggregation):
    """A one-turn episode with advantage +1 and a three-turn episode (same tokens each turn) with
    advantage -1 cancel exactly. Counting items instead of episodes would weigh the second 3x."""
    model, tok = load_policy(str(tiny_model_dir), dtype="float32")
    prompt, completion = (5, 6, 7, 8), (9, 10, 11)
    x = SAWItem(prompt, completion, 1.0, meta={"rollout_id": "x"})
    ys = [SAWItem(prompt, completion, -1.0, episode_share=1 / 3, meta={"rollout_id": "y", "step_index": i})
          for i in range(3)]
    algo = make_algorithm("reinforce", is_cap=None, aggregation=aggregation)
    trainer = Trainer(model, algo, None, TrainerConfig(lr=0.0, max_grad_norm=1e9), pad_token_id=tok.pad_token_id)
    cancel = trainer.optimize([x, *ys])["grad_norm"]
    same_sign = [SAWItem(prompt, completion, 1.0, episode_share=1 / 3) for _ in range(3)]
    reference = trainer.optimize([x, *same_sign])["grad_norm"]
    assert reference > 1e-3 and cancel < 1e-4 * reference, (cancel, reference)  # fp32 rounding only


async def test_items_record_the_sampling_temperature(scripted, tokenizer):
    client = scripted(["one", "two words", "three"], tokenizer)
    agent = Agent(client, FullDialog("Be brief."), sampling=SamplingParams(temperature=0.7, top_p=0.95))
    [r] = await SingleAgentProtocol(agent).run(CountEnv(), max_steps=5, env_seed=0)
    assert all(s.trace.temperature == 0.7 and s.trace.top_p == 0.95 for s in r.steps)
    [item] = build_saw_items([r], MonteCarloReturn())
    assert item.temperature == 0.7 and item.top_p == 0.95
