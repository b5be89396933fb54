import json
from dataclasses import dataclass

import pytest
from conftest import require

from ludic.config import field_docs, parse_config
from ludic.training.loggers import JsonlLogger, MultiLogger, make_logger


def test_jsonl_logger_writes_scalars(tmp_path):
    lg = JsonlLogger(tmp_path / "m.jsonl")
    lg.log(1, {"loss": 0.5, "flag": True, "text": "skip", "nan": float("nan")})
    lg.close()
    rec = json.loads((tmp_path / "m.jsonl").read_text())
    assert rec["step"] == 1 and rec["loss"] == 0.5 and rec["flag"] == 1.0 and rec["nan"] is None
    assert "text" not in rec


def test_failing_sink_is_dropped(tmp_path, capsys):
    class Broken:
        def log(self, step, metrics):
            raise OSError("disk full")

        def close(self):
            pass

    ok = JsonlLogger(tmp_path / "m.jsonl")
    multi = MultiLogger([Broken(), ok])
    multi.log(1, {"a": 1.0})
    multi.log(2, {"a": 2.0})
    assert len(multi.loggers) == 1 and "disk full" in capsys.readouterr().err
    assert len((tmp_path / "m.jsonl").read_text().splitlines()) == 2


def test_make_logger_with_offline_wandb_and_tensorboard(tmp_path, monkeypatch):
    require("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    lg = make_logger("rich,wandb,tensorboard", tmp_path, {"lr": 1e-4}, total_steps=2)
    assert [type(x).__name__ for x in lg.loggers] == ["JsonlLogger", "RichLogger", "WandbLogger", "TensorBoardLogger", "ReportLogger"]
    lg.log(1, {"loss": 1.0, "reward_mean": 0.5})
    lg.close()
    assert list((tmp_path / "wandb").glob("offline-run-*"))
    assert list((tmp_path / "tensorboard").glob("events.*"))
    with pytest.raises(ValueError, match="unknown logger 'bogus'"):
        make_logger("bogus", tmp_path, {})


@dataclass
class _Cfg:
    """A test config."""

    steps: int = 3
    """How many steps."""
    name: str | None = None
    fast: bool = False


def test_config_cli_generation():
    assert field_docs(_Cfg) == {"steps": "How many steps."}
    cfg = parse_config(_Cfg, ["--steps", "5", "--name", "x", "--fast"])
    assert (cfg.steps, cfg.name, cfg.fast) == (5, "x", True)
    assert parse_config(_Cfg, ["--name", "none"]).name is None
    with pytest.raises(SystemExit):
        parse_config(_Cfg, ["--steps", "five"])


TRAINER_FLAGS = ["--lr", "0.002", "--max-grad-norm", "0.3", "--lr-schedule", "linear", "--warmup-steps", "2",
                 "--weight-decay", "0.01", "--ppo-epochs", "2", "--num-minibatches", "2", "--max-lag", "3",
                 "--micro-token-budget", "1024", "--max-seq-len", "512", "--checkpoint-every", "5",
                 "--max-empty-steps", "4", "--betas", "0.8,0.95"]


def _recipe_configs():
    from ludic.recipes.dpo import DPOTrainConfig
    from ludic.recipes.grpo_prompts import TrainPromptsConfig
    from ludic.recipes.sft import SFTConfig
    from ludic.tictactoe.train import TrainTicTacToeConfig

    return [TrainTicTacToeConfig, TrainPromptsConfig, SFTConfig, DPOTrainConfig]


@pytest.mark.parametrize("cls", _recipe_configs(), ids=lambda c: c.__name__)
def test_every_training_recipe_embeds_the_whole_trainer_section(cls):
    """One shared trainer section, not hand-copied fields (train prompts used to drop clipping and the schedule)."""
    cfg = parse_config(cls, TRAINER_FLAGS)
    t = cfg.trainer
    assert (t.lr, t.max_grad_norm, t.lr_schedule, t.warmup_steps, t.weight_decay) == (0.002, 0.3, "linear", 2, 0.01)
    assert (t.ppo_epochs, t.num_minibatches, t.max_lag, t.micro_token_budget, t.max_seq_len) == (2, 2, 3, 1024, 512)
    assert (t.checkpoint_every, t.max_empty_steps, t.betas) == (5, 4, (0.8, 0.95))


def test_train_prompts_passes_the_schedule_to_the_trainer(tiny_model_dir, tmp_path):
    from ludic.data.jsonl import write_jsonl
    from ludic.tictactoe.thinktactoe import make_grpo_records
    from ludic.recipes.grpo_prompts import TrainPromptsConfig, train_prompts

    data = tmp_path / "grpo.jsonl"
    write_jsonl(data, make_grpo_records(4, seed=0))
    run = tmp_path / "run"
    cfg = parse_config(TrainPromptsConfig, ["--model", str(tiny_model_dir), "--data", str(data), "--run-dir", str(run),
                                            "--group-size", "2", "--prompts-per-step", "1", "--train-steps", "2",
                                            "--max-completion-tokens", "4", "--logger", "none", "--lr", "0.01",
                                            "--warmup-steps", "2", "--max-grad-norm", "0.25"])
    train_prompts(cfg)
    lrs = [json.loads(x)["lr"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert lrs == pytest.approx([0.005, 0.01])  # warmup 1/2, 2/2
    assert json.loads((run / "config.json").read_text())["trainer"]["max_grad_norm"] == 0.25
