"""Micro-batches sized by memory (``ludic.training.memory``): the estimate of what a scored forward keeps for
its backward against what autograd actually saves, and the trainer's split by it, which changes how a batch is
cut, not the gradient it adds up to."""

import pytest
import torch

from ludic.inference.models import load_model
from ludic.training.lora import LoraSettings, apply_lora
from ludic.training.memory import MicroBatchMemory, micro_batch_budget
from ludic.training.microbatch import collate, split_by_token_budget
from ludic.training.packed import TreeCost
from ludic.training.scoring import score_actions
from ludic.types import SAWItem


def _model(tiny_model_dir, dtype=torch.float32, top_layers=0):
    torch.manual_seed(0)
    model = apply_lora(load_model(str(tiny_model_dir), dtype="float32").to(dtype),
                       LoraSettings(rank=4, alpha=8.0, top_layers=top_layers))
    torch.manual_seed(1)
    for n, p in model.named_parameters():
        if "lora_B" in n:
            p.data.normal_(0, 0.05)
    return model.train()


def _items(n, prompt, completion, shared, seed=0):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda k: torch.randint(200, 900, (k,), generator=g).tolist()  # noqa: E731
    system = rnd(shared)
    return [SAWItem(tuple(system + rnd(prompt - shared)), tuple(rnd(completion)), 1.0 - 0.3 * i,
                    logprobs=[-1.0] * completion) for i in range(n)]


def _saved_activation_bytes(model, items):
    """Bytes of the tensors autograd saves in one scored forward, the parameters and the [N, vocab] logits
    left out (those are counted per scored token apart)."""
    vocab = model.get_base_model().config.vocab_size
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params and not (t.dim() == 2 and t.shape[-1] == vocab):
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        score_actions(model, collate(items, 0))
    return sum(seen.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", [(8, 60, 16, 20), (8, 60, 16, 0), (4, 100, 30, 60), (16, 20, 20, 20), (6, 40, 90, 40)])
def test_the_estimate_is_what_autograd_saves(tiny_model_dir, dtype, layout):
    """Within 20% of the bytes autograd keeps (the logits apart, counted per scored token), over layouts with
    and without a shared prompt part, in fp32 and bf16 (SmolLM2-135M in fp32: within 3%)."""
    model = _model(tiny_model_dir, dtype)
    items = _items(*layout)
    mem, tree = MicroBatchMemory(model), TreeCost().add(items)
    logits = 2 * tree.completion_tokens * mem.vocab * mem.width
    assert 0.8 < _saved_activation_bytes(model, items) / (mem.flat(tree) - logits) < 1.2


def test_the_budget_follows_the_megabytes_the_layers_trained_and_checkpointing(tiny_model_dir):
    model = _model(tiny_model_dir)
    assert micro_batch_budget(model, 4096, 512) == (4096, None)  # a budget in tokens, when given, wins
    budget, mem = micro_batch_budget(model, 0, 512)
    assert budget == 512 * 2**20 and isinstance(mem, MicroBatchMemory)
    tree = TreeCost().add(_items(8, 60, 16, 20))
    assert MicroBatchMemory(model, checkpointing=True).flat(tree) < mem.flat(tree)
    top = MicroBatchMemory(_model(tiny_model_dir, top_layers=1))  # the backward stops above the bottom layer
    assert (top.layers, mem.layers) == (1, 2) and top.flat(tree) < mem.flat(tree)


def test_a_group_behind_one_long_prompt_stays_together_where_distinct_prompts_split(tiny_model_dir):
    """The flat pass computes a GRPO group's prompt once: eight short replies behind one 400-token prompt fit
    where eight items of the same padded size with prompts of their own do not."""
    mem = MicroBatchMemory(_model(tiny_model_dir))
    group, own = _items(8, 400, 2, 400), _items(8, 400, 2, 0)
    budget = 2 * mem.flat(TreeCost().add(group))
    assert len(split_by_token_budget(group, budget, flat=True, memory=mem)) == 1
    parts = split_by_token_budget(own, budget, flat=True, memory=mem)
    assert len(parts) > 1 and all(mem.flat(TreeCost().add(p)) <= budget for p in parts)


def test_the_trainer_cuts_batches_by_its_memory_budget_into_the_same_gradient(tiny_model_dir, monkeypatch):
    """``micro_token_budget`` 0 (the default): micro-batches of at most the tokens ``micro_batch_mb`` holds;
    the step's gradient is the one a single micro-batch gives (the losses add up), to float rounding."""
    from ludic.training import trainer as trainer_module
    from ludic.training.algorithms import make_sft
    from ludic.training.config import TrainerConfig
    from ludic.training.trainer import Trainer

    items = _items(8, 100, 20, 40)
    sizes: list[int] = []
    real_collate = trainer_module.collate
    monkeypatch.setattr(trainer_module, "collate", lambda g, *a, **k: sizes.append(len(g)) or real_collate(g, *a, **k))
    grads = []
    for cfg in (TrainerConfig(micro_token_budget=8192), TrainerConfig()):
        model = _model(tiny_model_dir)
        mem = MicroBatchMemory(model)
        two, three = (mem.flat(TreeCost().add(items[:n])) / 2**20 for n in (2, 3))
        mb = (two + three) / 2  # room for two items, not three
        trainer = Trainer(model, make_sft(), None, TrainerConfig(**{**cfg.__dict__, "micro_batch_mb": mb, "lr": 0.0}),
                          pad_token_id=0)
        trainer.optimizer.step = lambda *a, **k: None  # keep the gradients to compare them
        trainer.optimizer.zero_grad = lambda *a, **k: None
        sizes.clear()
        trainer.optimize(items)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        if cfg.micro_token_budget:
            assert sizes == [8]
        else:
            assert sizes == [2, 2, 2, 2]
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for n in grads[0]:
        assert torch.allclose(grads[0][n], grads[1][n], rtol=1e-4, atol=1e-7), n
