"""Progress of long work: a bar on a terminal, quiet lines with an ETA elsewhere (ludic.progress)."""

import io
import time

import pytest
from ludic.progress import Progress, format_seconds, progress_mode, track
from ludic.training.loggers import RichLogger


def test_lines_mode_is_quiet_and_ends_with_a_full_count(monkeypatch):
    out = io.StringIO()
    with Progress("datagen", 100, unit="episode", stream=out, every_s=3600) as bar:
        for _ in range(100):
            bar.update(1, kept=3)
    lines = out.getvalue().splitlines()
    assert lines == [lines[0], lines[-1]] and lines[0].startswith("[datagen] 0/100 (0%)")  # start and end only
    assert lines[-1].startswith("[datagen] 100/100 (100%)") and "kept=3" in lines[-1] and "eta" not in lines[-1]


def test_lines_mode_shows_an_eta_while_running():
    out = io.StringIO()
    bar = Progress("sft", 10, stream=out, every_s=0.0)
    time.sleep(0.02)
    bar.update(2, loss=0.5)
    assert "eta 0:00" in out.getvalue().splitlines()[-1] and "loss=0.5" in out.getvalue()
    assert bar.eta_s() == pytest.approx((time.monotonic() - bar.t0) / 2 * 8, rel=0.2)
    bar.close()
    assert format_seconds(3725) == "1:02:05" and format_seconds(65) == "1:05"


def test_mode_from_the_environment(monkeypatch):
    monkeypatch.setenv("LUDIC_PROGRESS", "off")
    out = io.StringIO()
    assert list(track(range(3), "x", stream=out)) == [0, 1, 2] and out.getvalue() == ""
    monkeypatch.setenv("LUDIC_PROGRESS", "loud")
    with pytest.raises(ValueError, match="LUDIC_PROGRESS='loud'"):
        progress_mode()
    monkeypatch.delenv("LUDIC_PROGRESS")
    assert progress_mode(io.StringIO()) == "lines"  # not a terminal


def test_bar_mode_renders_count_eta_and_metric():
    out = io.StringIO()
    with Progress("eval", 3, stream=out, mode="bar") as bar:
        for _ in range(3):
            bar.update(1, win_rate=0.25)
    text = out.getvalue()
    assert "eval" in text and "3/3" in text and "eta" in text and "win_rate=0.25" in text


def test_training_logger_lines_off_a_terminal(capsys, monkeypatch):
    monkeypatch.setenv("LUDIC_PROGRESS_EVERY", "3600")
    lg = RichLogger(total_steps=20, desc="rl")
    for step in range(1, 21):
        lg.log(step, {"loss": 1.0 / step, **({"eval/win_rate": 0.5} if step == 10 else {})})
    lg.close()
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("step")]
    assert [x.split()[1] for x in lines] == ["1/20", "10/20", "20/20"]  # first, eval, last
    assert "eval/win_rate=0.5" in lines[1] and "eta" in lines[1] and "eta" not in lines[2]
    # the first step's line has no ETA: the time before it (evaluations, a cold start) is not a step's (it read
    # eta 1:34:59 after the first validation)
    assert "eta" not in lines[0]


def test_a_stage_label_tells_cold_start_steps_from_rl_steps(capsys):
    lg = RichLogger(total_steps=10, desc="format demos", label="format demos")
    lg.log(1, {"loss": 2.0})
    assert any(x.startswith("[format demos] step 1/10") for x in capsys.readouterr().out.splitlines())


def test_training_logger_takes_a_planned_step_count(capsys, monkeypatch):
    monkeypatch.setenv("LUDIC_PROGRESS_EVERY", "0")
    lg = RichLogger(total_steps=None, desc="sft")
    lg.log(1, {"loss": 1.0})
    lg.log(2, {"planned_steps": 8})
    lg.log(3, {"loss": 0.5})
    assert capsys.readouterr().out.splitlines()[-1].startswith("step 3/8") and lg.progress.total == 8


def test_no_eta_until_enough_concurrent_units_are_done():
    """Episodes run together finish in bursts: the rollout engine's progress waits for 5% before an ETA
    (an ETA from the first of 64 episodes read 38 minutes for a 36-second evaluation)."""
    out = io.StringIO()
    bar = Progress("eval", 64, stream=out, every_s=0.0, eta_after=3)
    bar.update(1)
    bar.update(1)
    assert bar.eta_s() is None and "eta" not in out.getvalue()
    bar.update(1)
    assert bar.eta_s() is not None and "eta" in out.getvalue().splitlines()[-1]


def test_evaluation_progress_moves_as_episodes_finish_inside_one_generation_batch(tiny_model_dir, monkeypatch):
    """The rollout engine counts an episode when it ends. The in-process engine generates every pending reply in
    one batch; it used to hand the replies out only when the whole batch was done, so an evaluation's bar sat at
    0 or 1 of 64 for minutes and jumped to 64/64. Now a reply is handed out at the decode step its row finishes:
    on a real tiny model, episodes with shorter replies count while the batch still generates."""
    import asyncio

    from conftest import VowelEnv  # noqa: F401  (registers test_vowels)
    from ludic.agents.agent import Agent
    from ludic.context import FullDialog
    from ludic.inference.client import SamplingParams
    from ludic.inference.models import load_model, load_tokenizer
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.interaction import SingleAgentProtocol
    from ludic.rollouts import engine as rollout_engine
    from ludic.types import EnvSpec, RolloutRequest

    model, tok = load_model(str(tiny_model_dir), dtype="float32"), load_tokenizer(str(tiny_model_dir))
    llm = TransformersEngine(model, tok)
    seen: list[tuple[int, int]] = []  # (episodes counted, generation batches finished) at each update

    class Recording(Progress):
        def update(self, n=1, **metrics):
            super().update(n, **metrics)
            seen.append((self.n, llm.stats["batches"]))

    monkeypatch.setattr(rollout_engine, "Progress", Recording)
    lengths = (2, 4, 6, 8, 10, 12)  # greedy replies of these many tokens (the random model rarely ends one early)
    protos = {f"len{n}": (lambda n=n: SingleAgentProtocol(Agent(llm, FullDialog(), sampling=SamplingParams(
        temperature=0.0, max_tokens=n), reject_incomplete=False))) for n in lengths}
    reqs = [RolloutRequest(EnvSpec("test_vowels"), protocol=f"len{n}", env_seed=i) for i, n in enumerate(lengths)]
    rollouts = asyncio.run(rollout_engine.RolloutEngine(protos, concurrency=8).generate_rollouts(reqs, progress="eval"))
    assert len(rollouts) == len(lengths) and llm.stats["batches"] == 1  # one batch generated every reply
    assert [n for n, _ in seen] == list(range(1, len(lengths) + 1))
    during = [n for n, batches in seen if batches == 0]
    assert len(during) >= len(lengths) - 2, seen  # counted while the batch still generated its longer rows
