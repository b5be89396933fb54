import json
from dataclasses import dataclass

import pytest

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
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    lg = make_logger("rich,wandb,tensorboard", tmp_path, {"lr": 1e-4}, total_steps=2)
    assert [type(x).__name__ for x in lg.loggers] == ["JsonlLogger", "RichLogger", "WandbLogger", "TensorBoardLogger"]
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
