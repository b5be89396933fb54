"""The shared blocks of the command configs: each group of flags is written once, here.

A command's config is a dataclass that inherits the blocks it uses and adds only its own fields::

    @dataclass
    class TrainEnvConfig(ModelBlock, LoraBlock, GRPOBlock, TrainRunBlock):
        env: EnvConfig = ...          # a section: a block passed around whole
        trainer: TrainerConfig = ...  # the trainer section (``ludic.training.config``)
        eval_episodes: int = 64       # this command's own fields

A block's fields are the command's own attributes (``cfg.model``, ``cfg.lora_rank``), so the flags are
the same as they have always been (``--model``, ``--lora-rank``), and ``ludic.config`` prints each
block as one group in ``--help``. A command that wants another default (SFT trains all weights) redeclares
that one field with the new default; everything else comes from the block. A *section* (a field whose
type is a dataclass, like ``trainer``) is for settings handed to one component whole (the ``Trainer``
takes a ``TrainerConfig``).

The blocks, in the order a run uses them:

- ``ModelBlock``: which policy to load (``--model``, ``--adapter``, ``--dtype``, ``--device``);
- ``LoraBlock``: what to train (``--lora-rank``, ``--lora-alpha``, ``--full-finetune``);
- ``GRPOBlock``: how a step samples (``--group-size``, ``--prompts-per-step``, ``--temperature``, the
  algorithm and its KL, the number of steps);
- ``TrainerConfig`` (a section): how a step optimises (``--lr``, ``--max-grad-norm``, ...);
- ``RunBlock``: where the run lives and what it logs (``--run-dir``, ``--logger``, ``--seed``), and
  ``TrainRunBlock`` adds its checkpoints (``--resume``, ``--final-save``);
- ``InferenceBlock`` / ``EvalInferenceBlock``: which engine samples (in process, or a vLLM server);
- ``PipelineBlock``: the Redis pipeline's actors and learner (``--redis-url``, ``--stream-prefix``, ...);
- ``OfflineBlock``: SFT and DPO on a dataset (``--data``, ``--epochs``, ``--batch-size``, ...).

Blocks of one family of commands live beside them: ``GamesBlock`` (``recipes.games_setup``: train and
eval games), ``TicTacToeBlock`` and ``ColdStartBlock`` (``tictactoe.prompts``: the tic-tac-toe commands
and recipes). ``tests/test_config_blocks.py`` fails when a config copies a block's fields instead of
inheriting them.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ludic.inference.models import DEFAULT_MODEL


@dataclass
class ModelBlock:
    """Model: the policy to load."""

    model: str = DEFAULT_MODEL
    """Base model: hub id, local folder, or the packaged default (SmolLM2-135M-Instruct)."""
    adapter: str | None = None
    """Start from this LoRA adapter folder (e.g. runs/.../checkpoints/step_000030/model)."""
    dtype: str = "auto"
    """auto (bf16 where the CPU or GPU computes it natively, else fp32) | bfloat16 | float16 | float32."""
    device: str = "auto"
    """cpu, cuda, cuda:N; auto: the GPU when PyTorch sees one (``$LUDIC_DEVICE`` overrides)."""


@dataclass
class LoraBlock:
    """LoRA: which weights train."""

    lora_rank: int = 16
    lora_alpha: float = 32.0
    full_finetune: bool = False
    """Train all weights (else a LoRA adapter with lora_rank / lora_alpha)."""

    def lora_settings(self) -> Any:
        """The ``LoraSettings`` these flags ask for; None for full fine-tuning."""
        from ludic.training.lora import LoraSettings

        return None if self.full_finetune else LoraSettings(rank=self.lora_rank, alpha=self.lora_alpha)


@dataclass
class GRPOBlock:
    """Sampling: what one RL step collects (GRPO groups) and with which algorithm."""

    group_size: int = 8
    """Samples per prompt (a GRPO group: same prompt or env seed, different sampling seeds)."""
    prompts_per_step: int = 4
    """Prompts (or env seeds) per step, each sampled group_size times."""
    train_steps: int = 30
    """Optimizer steps."""
    temperature: float = 1.0
    """Sampling temperature of the training rollouts."""
    algorithm: str = "grpo"
    """grpo, dr_grpo, dapo, gspo, cispo, rloo, reinforce, reinforce_baseline."""
    kl_coef: float = 0.0
    """KL penalty to the starting policy (the adapter switched off; a frozen copy for full fine-tuning)."""
    entropy_coef: float = 0.0
    """Entropy bonus: the loss subtracts this times the policy's mean per-token entropy (over the whole vocabulary),
    against a collapse onto one answer; 0 is off (docs/troubleshooting.md)."""


@dataclass
class RunBlock:
    """Run: where it is written, what it logs, how it resumes."""

    run_dir: str | None = None
    """Run directory (default: runs/<command>-<time>)."""
    logger: str = "rich"
    """rich, print, wandb, tensorboard, none; combine with commas (rich,wandb)."""
    seed: int = 0
    """Seeds the LoRA initialisation, the sampling and the order of the data."""

    def resolve_run_dir(self, prefix: str) -> Path:
        """``run_dir``, or a new ``runs/<prefix>-<time>`` (created, so two runs started in the same second get
        two folders)."""
        from ludic.distributed import is_rank0
        from ludic.recipes.common import default_run_dir

        return Path(self.run_dir) if self.run_dir else default_run_dir(prefix, claim=is_rank0())


@dataclass
class TrainRunBlock(RunBlock):
    """A training run's checkpoints (listed with ``RunBlock`` in ``--help``)."""

    resume: bool = True
    """Continue from the latest checkpoint in run_dir if there is one (--no-resume: start over; an earlier run
    there is moved aside to <run_dir>.replaced-<time>)."""
    final_save: bool = True
    """Save a checkpoint at the end of training (in addition to periodic saves)."""

    def resolve_run_dir(self, prefix: str, lock: bool = True) -> Path:
        """``run_dir`` (or a new one), with its writer lock held by this process (``lock_run_dir``: a second
        live run there gets a clear error); with ``--no-resume``, emptied of an earlier run first
        (``start_over``). ``lock=False``: a reader beside the run (a pipeline actor)."""
        from ludic.distributed import is_rank0

        path = super().resolve_run_dir(prefix)
        if lock and is_rank0():
            lock_run_dir(path)
        if not self.resume:
            start_over(path)
        return path


RUN_FILES = ("checkpoints", "metrics.jsonl", "summary.json")
"""What marks a folder as holding a Ludic run (``start_over`` moves only such a folder)."""
_started_over: set[Path] = set()
LOCK_FILE = ".ludic.lock"
"""The run directory's writer lock (``lock_run_dir``): an ``flock`` held while the run lives, with its pid."""
_locks: dict[Path, int] = {}
"""The run directories this process holds (resolved path -> the lock file's descriptor)."""


def lock_run_dir(run_dir: Path) -> None:
    """Create ``run_dir`` and hold its writer lock for the rest of this process (released when it exits, even by
    ``kill -9``). Another live process holding it: a ``UsageError`` naming its pid (two runs writing one folder
    mix their checkpoints and metrics). The same process may ask again (a recipe and its learner)."""
    import fcntl
    import os

    from ludic.errors import UsageError

    key = run_dir.resolve()
    if key in _locks:
        return
    key.mkdir(parents=True, exist_ok=True)
    fd = os.open(key / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise UsageError(f"{run_dir} is in use by a live run (pid {holder}): two runs writing one folder mix their "
                         "checkpoints and metrics. Give another --run-dir, or wait for that run to end") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _locks[key] = fd


def _unlock(key: Path) -> None:
    import os

    fd = _locks.pop(key, None)
    if fd is not None:
        os.close(fd)


def start_over(run_dir: Path) -> Path | None:
    """``--no-resume`` where ``run_dir`` holds an earlier run: move that run aside, whole, to the sibling
    ``<run_dir>.replaced-<time>`` and return where it went (None when there was none). The new run then
    starts in an empty folder: trained among the old files, its checkpoints were pruned in favour of the
    old run's higher steps, a later resume continued the old run, and ``metrics.jsonl`` mixed the two.

    Once per folder per process (the pipeline's learner resolves its run dir again), on rank 0 only (every
    rank resolves it, then they share rank 0's)."""
    from ludic.distributed import is_rank0
    from ludic.errors import UsageError

    run_dir = run_dir.resolve()
    if run_dir in _started_over or not is_rank0():
        return None
    _started_over.add(run_dir)
    if not any((run_dir / f).exists() for f in RUN_FILES):
        return None
    if Path.cwd().resolve().is_relative_to(run_dir):
        raise UsageError(f"--no-resume would move the earlier run in {run_dir} aside, but it holds the working "
                         "directory: give another --run-dir")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest = run_dir.with_name(f"{run_dir.name}.replaced-{stamp}")
    for n in range(1, 1000):
        if not dest.exists():
            break
        dest = run_dir.with_name(f"{run_dir.name}.replaced-{stamp}-{n}")
    locked = run_dir in _locks
    _unlock(run_dir)  # this process's lock moves with the folder; the new folder gets its own
    run_dir.rename(dest)
    run_dir.mkdir()  # where a symlink pointed, it points at the new, empty run
    if locked:
        lock_run_dir(run_dir)
    print(f"[ludic] --no-resume: the earlier run in {run_dir} was moved aside to {dest}", flush=True)
    return dest


@dataclass
class InferenceBlock:
    """Inference: which engine samples the training rollouts."""

    inference: str = "transformers"
    """transformers (in process, sharing the trainer's model) | vllm (a server started for the run, or the
    one at --port)."""
    host: str = "127.0.0.1"
    port: int = 0
    """With --inference vllm: a running Ludic vLLM server on this port (0: start one for the run)."""


@dataclass
class EvalInferenceBlock:
    """Inference: which engine answers (a local model, or a vLLM server)."""

    inference: str = "transformers"
    """transformers (in process) | vllm (the Ludic vLLM server at --host/--port)."""
    start_server: bool = False
    """With --inference vllm: start a server for this command (else use the one at --host/--port)."""
    host: str = "127.0.0.1"
    port: int = 8000


@dataclass
class PipelineBlock:
    """Pipeline: actors and a learner that share a run through Redis (``ludic actor`` / ``ludic learner``)."""

    redis_url: str = ""
    """The pipeline's Redis, e.g. redis://10.0.0.1:6379/0 (train tictactoe --pipeline/--overlap: empty starts a
    redis-server in <run_dir>/redis)."""
    stream_prefix: str = "ludic"
    """Namespaces the run's Redis keys: the actors and the learner of one run use the same one."""
    max_unread: int = 64
    """Actors wait while this many items wait for the learner (backpressure; streams are never trimmed)."""
    actor_id: str = ""
    """ludic actor: this actor's name in item meta and logs (default: actor-<n>, numbered in Redis as actors
    start). Its env and sampling seeds derive from --seed and this name (recipes.pipeline.actor_seed): actors
    started alike draw different ones; the same --actor-id and --seed draw the same again."""
    actor_batches: int = 0
    """ludic actor: batches to push before exiting (0: until stopped)."""
    batch_timeout_s: float = 0.0
    """ludic learner: fail when a batch is not complete after this long (0: wait for actors forever)."""


@dataclass
class OfflineBlock:
    """Dataset: SFT and DPO passes over JSONL records."""

    data: str = ""
    """One or more JSONL files, comma-separated."""
    epochs: float = 1.0
    batch_size: int = 4
    """Examples per optimizer step per rank (effective batch = batch_size x world size)."""
    chat_template: bool = True
    """Apply the chat template to string prompts (messages records always use it)."""
    max_steps: int = 0
    """Stop after this many steps (0: epochs decide)."""
    logs_dir: str | None = None
    """Also write the seed's text log (<command>_training_logs_<time>.txt) here (default: the run dir)."""
    log_every: int = 1
    """Log every N optimizer steps (the last step always)."""

    def data_paths(self) -> list[str]:
        return [p.strip() for p in self.data.split(",") if p.strip()]

    def steps_for(self, examples: int, world: int = 1) -> int:
        """Optimizer steps: ``epochs`` passes over ``examples`` at ``batch_size`` per rank, at most ``max_steps``."""
        steps = math.ceil(self.epochs * examples / (self.batch_size * world))
        return min(steps, self.max_steps) if self.max_steps else steps


def open_offline_logger(cfg: Any, run_dir: Path, steps: int, kind: str) -> Any:
    """Rank 0 of an SFT or DPO run: the run directory with its config.json, the ``--logger`` sinks and the
    seed's text log (``<kind>_training_logs_<time>.txt`` in ``--logs-dir``); None on the other ranks."""
    from dataclasses import asdict

    from ludic.config import dump_config
    from ludic.data.text_logs import TextLogLogger
    from ludic.distributed import is_rank0
    from ludic.training.loggers import MultiLogger, make_logger

    if not is_rank0():
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, run_dir / "config.json")
    logger = make_logger(cfg.logger, run_dir, asdict(cfg), total_steps=steps)
    return MultiLogger(logger.loggers + [TextLogLogger(cfg.logs_dir or run_dir, kind)])


def load_policy_for(cfg: ModelBlock, **kwargs: Any) -> tuple[Any, Any]:
    """``load_policy`` with a config's model, adapter, dtype, device and seed, and its LoRA settings when
    the config has a ``LoraBlock``; ``kwargs`` override any of them."""
    from ludic.training.lora import load_policy

    args: dict[str, Any] = dict(model=cfg.model, adapter=cfg.adapter, dtype=cfg.dtype, device=cfg.device,
                                seed=getattr(cfg, "seed", 0))
    if isinstance(cfg, LoraBlock):
        args["lora"] = cfg.lora_settings()
    args.update(kwargs)
    return load_policy(args.pop("model"), **args)


def kept_summary(best: dict[str, Any], validation: int, unit: str = "episodes") -> dict[str, Any]:
    """The ``kept`` entry of a run's results under keep-best (``Trainer.best``, chosen on ``validation``
    held-out items apart from the test ones): the kept step and its score beside the last step's."""
    key = best["metric"]
    return {"step": best["step"], "metric": key, "value": best["value"], "last_step": best["last_step"],
            "last_value": best["last_eval"][key], "episodes": validation,
            "note": f"chosen on {validation} validation {unit}, apart from the test {unit}"}
