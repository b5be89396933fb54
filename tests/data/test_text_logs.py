"""The seed's training-log text format: exact layout, parse-back, errors."""

from __future__ import annotations

from datetime import datetime

import pytest
import torch

from ludic.data.jsonl import DatasetError
from ludic.data.text_logs import TextLogLogger, read_text_log
from ludic.training.loggers import MetricsLogger

STARTED = datetime(2024, 1, 15, 14, 30, 25)


def test_layout_is_exactly_the_seed_example(tmp_path):
    logger: MetricsLogger = TextLogLogger(tmp_path / "logs", "grpo", started=STARTED)
    logger.log(10, {"loss": 0.0612, "grad_norm": 1.2164300680160522, "learning_rate": 1.4814814814814815e-06,
                    "num_tokens": 733184.0, "mean_token_accuracy": 0.972096461057663, "epoch": 2.86,
                    "reward_mean": 0.75, "reward_std": 0.25})
    logger.close()
    path = tmp_path / "logs" / "grpo_training_logs_20240115_143025.txt"
    assert path.read_text() == """=== GRPO Training Logs ===
Started at: 2024-01-15 14:30:25
==================================================

Step 10: {
  "loss": 0.0612,
  "grad_norm": 1.2164300680160522,
  "learning_rate": 1.4814814814814815e-06,
  "num_tokens": 733184.0,
  "mean_token_accuracy": 0.972096461057663,
  "epoch": 2.86,
  "reward_mean": 0.75,
  "reward_std": 0.25
}
------------------------------
"""


@pytest.mark.parametrize("kind", ["sft", "dpo", "grpo"])
def test_file_name_header_and_separators(tmp_path, kind):
    with TextLogLogger(tmp_path, kind, started=STARTED) as logger:
        logger.log(1, {"loss": 2.5})
        logger.log(2, {"loss": 2.0, "epoch": 0.5})
    assert logger.path.name == f"{kind}_training_logs_20240115_143025.txt"
    lines = logger.path.read_text().split("\n")
    assert lines[0] == f"=== {kind.upper()} Training Logs ==="
    assert lines[1] == "Started at: 2024-01-15 14:30:25"
    assert lines[2] == "=" * 50 and lines[3] == ""
    assert lines[4] == "Step 1: {" and lines[5] == '  "loss": 2.5' and lines[6] == "}"
    assert lines[7] == "-" * 30 and lines[8] == "Step 2: {"
    assert lines[-2] == "-" * 30 and lines[-1] == ""
    assert lines.count("-" * 30) == 2


def test_round_trip_and_scalar_filtering(tmp_path):
    logger = TextLogLogger(tmp_path, "sft", started=STARTED)
    logger.log(10, {"loss": torch.tensor(0.5), "tokens": 12, "ok": True, "note": "warmup",
                    "vector": torch.ones(3), "nested": {"a": 1}, "nan": float("nan")})
    # flushed after each step: readable before close
    info, steps = read_text_log(logger.path)
    assert info == {"title": "SFT Training Logs", "kind": "sft", "started": STARTED}
    assert steps[0][0] == 10
    metrics = steps[0][1]
    assert {k: v for k, v in metrics.items() if k != "nan"} == {"loss": 0.5, "tokens": 12, "ok": True,
                                                                "note": "warmup"}
    assert metrics["nan"] != metrics["nan"]
    logger.log(20, {})
    logger.close()
    logger.close()  # idempotent
    assert read_text_log(logger.path)[1][1] == (20, {})


def test_same_second_gets_a_new_file_and_default_start_is_now(tmp_path):
    a = TextLogLogger(tmp_path, "dpo", started=STARTED)
    b = TextLogLogger(tmp_path, "dpo", started=STARTED)
    assert a.path != b.path and b.path.name == "dpo_training_logs_20240115_143025_2.txt"
    a.close(), b.close()
    before = datetime.now().replace(microsecond=0)
    with TextLogLogger(tmp_path / "now", "grpo") as c:
        pass
    assert before <= read_text_log(c.path)[0]["started"] <= datetime.now()
    with pytest.raises(ValueError):
        TextLogLogger(tmp_path, "GRPO logs")


@pytest.mark.parametrize(
    "text, where",
    [
        ("=== GRPO Logs ===\n", ":1:"),
        ("=== GRPO Training Logs ===\nStarted: now\n", ":2:"),
        ("=== GRPO Training Logs ===\nStarted at: 2024-01-15 14:30:25\n=====\n\n", ":3:"),
        ("=== GRPO Training Logs ===\nStarted at: 2024-01-15 14:30:25\n" + "=" * 50 + "\n\nStep x: {}\n", ":5:"),
        ("=== GRPO Training Logs ===\nStarted at: 2024-01-15 14:30:25\n" + "=" * 50
         + "\n\nStep 1: {\n  \"loss\": 1\n}\n", ":5:"),
        ("=== GRPO Training Logs ===\nStarted at: 2024-01-15 14:30:25\n" + "=" * 50
         + "\n\nStep 1: {}\n" + "-" * 30 + "\nStep 2: {\n  \"loss\": \n}\n" + "-" * 30 + "\n", ":9:"),
    ],
)
def test_malformed_logs_name_file_and_line(tmp_path, text, where):
    path = tmp_path / "grpo_training_logs_20240115_143025.txt"
    path.write_text(text)
    with pytest.raises(DatasetError, match=rf"grpo_training_logs_20240115_143025\.txt{where}"):
        read_text_log(path)
