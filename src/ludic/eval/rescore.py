"""``ludic eval rescore RUN_OR_FILE --reward module:function``: score stored episodes again, without generating.

    ludic eval rescore runs/eval-20250101-120000 --reward my_rewards:strict
    ludic eval rescore runs/env-.../eval_trained.jsonl --reward my_rewards:strict --out strict.jsonl

``RUN_OR_FILE``: a rollout JSONL (``ludic eval env``'s samples, ``train env``'s ``eval_<stage>.jsonl`` or
``rollouts.jsonl``), or a run folder holding ``samples.jsonl``. Every episode of the policy (not a frozen opponent's
seat; not a failed episode, which stays a failure) is scored by the reward function:

    def strict(reply: str, info: dict) -> float | bool | dict:
        '''reply: the episode's final reply (the model's raw text of its last step); info: that step's info: the env's
        own keys (reasoning-gym and QA: ``reference``, and the extracted ``answer`` / ``predicted``; ...) and the
        agent's (``parse_error``, ``finish_reason``).'''
        return info.get("answer") == info["reference"]

A function that also takes a ``rollout`` argument (or ``**kwargs``) gets the whole episode as a ``ludic.types.Rollout``
(every step, its meta: env seed, ``reset_info``, problem and sample). It returns ``True`` / ``False`` (success;
reward 1 / 0), a number (the reward; success when it is at least 1, a full score), or a dict with ``reward`` and/or
``success``. ``module`` is imported as Python imports it (``PYTHONPATH`` for a module of your own).

The rescored file (default ``<stem>.rescored-<function>.jsonl`` beside the input) holds every episode with the new
reward on its last step (earlier steps' rewards set to 0), ``info["success"]`` the new success, and
``meta["rescored"]`` the function and the stored reward and success it replaced; ``<its stem>.summary.json`` beside it
holds ``eval.samples.sample_summary`` of the new scores (success with its 95% interval, pass@k where problems have
several samples, majority vote where episodes name answers, mean reward), under ``original`` the same of the stored
scores. Episodes are samples of one problem when they share ``meta["problem"]`` (``ludic eval env --samples``), else
when they share the env, its kwargs and its seed.
"""

from __future__ import annotations

import importlib
import inspect
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from ludic.errors import UsageError
from ludic.eval.samples import format_sample_metrics, outcome_of, sample_summary
from ludic.types import Rollout

RUN_SAMPLES = "samples.jsonl"
"""The episodes' file in a run folder of ``ludic eval env``."""


@dataclass
class RescoreConfig:
    """Score stored episodes again with another reward function (no generation)."""

    source: str = ""
    """RUN_OR_FILE (also the first argument): a rollout JSONL, or a run folder with samples.jsonl."""
    reward: str = ""
    """module:function scoring an episode (the module docstring of ludic.eval.rescore gives its signature)."""
    out: str = ""
    """The rescored JSONL; default: <input stem>.rescored-<function>.jsonl beside the input (its summary beside it)."""
    seed: int = 0
    """Seed of the bootstrap intervals."""


def load_reward_fn(spec: str) -> Callable[..., Any]:
    """The function ``module:function`` names; a wrong spec raises ``UsageError`` naming what is missing."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise UsageError(f"--reward must be module:function, got {spec!r}")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise UsageError(f"--reward {spec}: cannot import {module!r} ({e}); is its folder on PYTHONPATH?") from e
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise UsageError(f"--reward {spec}: {module} has no function {name!r}")
    return fn


def _wants_rollout(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "rollout" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def score(fn: Callable[..., Any], r: Rollout) -> tuple[float, bool]:
    """``(reward, success)`` of one episode by ``fn`` (module docstring: what it gets and may return)."""
    last = r.steps[-1]
    args = (last.action, dict(last.info))
    got = fn(*args, rollout=r) if _wants_rollout(fn) else fn(*args)
    if isinstance(got, dict):
        if "reward" not in got and "success" not in got:
            raise ValueError(f"the reward function returned a dict without 'reward' or 'success': {got!r}")
        reward = float(got["reward"]) if "reward" in got else float(bool(got["success"]))
        return reward, bool(got["success"]) if "success" in got else reward >= 1.0
    if isinstance(got, bool):
        return float(got), got
    if isinstance(got, (int, float)):
        return float(got), float(got) >= 1.0
    raise TypeError(f"the reward function returned {type(got).__name__} ({got!r}): give a bool, a number or a dict")


def rescore_record(record: dict[str, Any], fn: Callable[..., Any], spec: str) -> dict[str, Any]:
    """One stored rollout (its JSON) scored again by ``fn``; an opponent's or a failed episode comes back as it was."""
    r = Rollout.from_dict(record)
    if not r.steps or r.meta.get("failed") or not r.meta.get("trainable", True):
        return record
    reward, success = score(fn, r)
    steps = [{**s, "reward": 0.0} for s in record["steps"]]
    steps[-1] = {**steps[-1], "reward": reward, "info": {**steps[-1].get("info", {}), "success": float(success)}}
    before = outcome_of(r)
    meta = {**record.get("meta", {}), "rescored": {"reward_fn": spec, "reward": r.total_reward,
                                                   "success": before.success}}
    return {**record, "meta": meta, "total_reward": reward, "steps": steps}


def summary_of(records: list[dict[str, Any]], seed: int = 0) -> dict[str, Any]:
    """``sample_summary`` of the policy's episodes among stored rollout records."""
    rollouts = [Rollout.from_dict(d) for d in records]
    return {"episodes": sum(r.meta.get("trainable", True) for r in rollouts),
            **sample_summary([outcome_of(r) for r in rollouts if r.meta.get("trainable", True)], seed=seed)}


def resolve_source(source: str) -> Path:
    """The rollout file of ``RUN_OR_FILE``."""
    path = Path(source)
    if path.is_dir():
        if (path / RUN_SAMPLES).exists():
            return path / RUN_SAMPLES
        found = sorted(p.name for p in path.glob("*.jsonl"))
        raise UsageError(f"{path} has no {RUN_SAMPLES}; name one of its rollout files: {', '.join(found) or 'none'}")
    if not path.exists():
        raise UsageError(f"{source}: no such file or run folder")
    return path


def rescore(cfg: RescoreConfig) -> dict[str, Any]:
    """``ludic eval rescore``: writes the rescored file and its summary; returns the summary."""
    if not cfg.source or not cfg.reward:
        raise UsageError("give the episodes (RUN_OR_FILE) and --reward module:function")
    src = resolve_source(cfg.source)
    fn = load_reward_fn(cfg.reward)
    records = []
    for lineno, line in enumerate(src.read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except ValueError as e:
                raise UsageError(f"{src}:{lineno}: not a JSON rollout ({e})") from e
    rescored = []
    for lineno, rec in enumerate(records, 1):
        try:
            rescored.append(rescore_record(rec, fn, cfg.reward))
        except (KeyError, TypeError, ValueError) as e:
            raise UsageError(f"{src}:{lineno}: cannot rescore this episode ({type(e).__name__}: {e})") from e
    out = Path(cfg.out) if cfg.out else src.with_name(f"{src.stem}.rescored-{cfg.reward.rpartition(':')[2]}.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(d) + "\n" for d in rescored))
    summary = {"source": str(src), "reward_fn": cfg.reward, **summary_of(rescored, cfg.seed),
               "original": summary_of(records, cfg.seed), "config": asdict(cfg)}
    summary_path = out.with_name(f"{out.stem}.summary.json")
    summary_path.write_text(json.dumps(summary, indent=2))
    print(format_rescore(summary))
    print(f"rescored episodes written to {out}, summary to {summary_path}")
    return summary


def format_rescore(m: dict[str, Any]) -> str:
    """The rescored summary in a few lines, beside the stored scores'."""
    def line(x: dict[str, Any]) -> str:
        return (f"success {x['success_rate'] * 100:.1f}% (95% CI {x['success_ci95_low'] * 100:.1f}-"
                f"{x['success_ci95_high'] * 100:.1f}%), reward {x['reward_mean']:.3f} on {x['episodes']} episodes")

    extra = format_sample_metrics(m)
    return (f"{m['reward_fn']}: {line(m)}" + (f"\n  {extra}" if extra else "")
            + f"\nstored scores: {line(m['original'])}")
