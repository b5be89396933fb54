"""The command configs are composed from shared blocks (``ludic.recipes.blocks``): each group of flags is
written once, every command that has those flags inherits the block, ``--help`` prints one group per
block, and the flags themselves are the ones the commands always had."""

import dataclasses
import inspect

import pytest

from ludic.config import parse_config
from ludic.recipes import blocks


def _command_configs() -> list[type]:
    from ludic.recipes import dpo, env, games, grpo_prompts, qa, sft
    from ludic.tictactoe import datagen, recipe, seed_recipe, train

    out = []
    for mod in (env, games, qa, sft, dpo, grpo_prompts, train, datagen, recipe, seed_recipe):
        for name, obj in vars(mod).items():
            if (inspect.isclass(obj) and dataclasses.is_dataclass(obj) and obj.__module__ == mod.__name__
                    and name.endswith("Config") and name != "EnvConfig"):
                out.append(obj)
    return out


BLOCKS = [blocks.ModelBlock, blocks.LoraBlock, blocks.GRPOBlock, blocks.RunBlock, blocks.TrainRunBlock, blocks.InferenceBlock,
          blocks.EvalInferenceBlock, blocks.OfflineBlock]


def _names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _own(cls: type) -> dict[str, dataclasses.Field]:
    """Fields ``cls`` itself declares (not only inherits)."""
    ann = inspect.get_annotations(cls)
    return {f.name: f for f in dataclasses.fields(cls) if f.name in ann}


@pytest.mark.parametrize("cls", _command_configs(), ids=lambda c: c.__name__)
def test_a_config_that_has_a_blocks_fields_inherits_the_block(cls):
    """No hand copies: a command with every field of a block gets them from the block."""
    for block in BLOCKS:
        covered = any(issubclass(cls, b) and _names(block) <= _names(b) for b in BLOCKS)  # the eval inference
        if _names(block) <= _names(cls) and not covered:                                 # block has the train one's
            assert issubclass(cls, block), f"{cls.__name__} copies the fields of {block.__name__} instead of inheriting it"


@pytest.mark.parametrize("cls", _command_configs(), ids=lambda c: c.__name__)
def test_a_redeclared_block_field_changes_its_default_or_its_help(cls):
    """A command redeclares a block's field only to give it its own default or its own help text."""
    for block in BLOCKS:
        if not issubclass(cls, block):
            continue
        base = _names(block)
        for name, f in _own(cls).items():
            if name not in base:
                continue
            same_default = dataclasses.asdict(cls())[name] == dataclasses.asdict(block())[name]
            same_doc = name not in _own_docs(cls)
            assert not (same_default and same_doc), f"{cls.__name__}.{name} repeats {block.__name__}.{name} unchanged"


def _own_docs(cls: type) -> set[str]:
    """Names of the fields whose help text ``cls`` writes itself."""
    import ast
    import textwrap

    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body  # type: ignore[attr-defined]
    return {a.target.id for a, b in zip(body, body[1:])
            if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)}


def test_help_prints_one_group_per_block(capsys):
    from ludic.recipes.env import TrainEnvConfig

    with pytest.raises(SystemExit):
        parse_config(TrainEnvConfig, ["--help"], prog="ludic train env")
    text = capsys.readouterr().out
    titles = ["Model: the policy to load:", "LoRA: which weights train:", "Sampling:", "Run:", "Trainer:", "Env:"]
    for title in titles:
        assert title in text, title
    sections = {t: text.index(t) for t in titles}

    def group_of(flag: str) -> str:
        at = text.index(f"\n  {flag}")
        return max((pos, t) for t, pos in sections.items() if pos < at)[1]

    assert group_of("--lora-rank") == "LoRA: which weights train:"
    assert group_of("--model") == "Model: the policy to load:"
    assert group_of("--group-size") == "Sampling:"
    assert group_of("--run-dir") == "Run:"
    assert group_of("--lr") == "Trainer:"
    assert group_of("--env-kwargs") == "Env:"
    assert text.index("--eval-episodes") < min(sections.values())  # the command's own flags come first


def test_block_fields_parse_into_the_commands_own_attributes():
    from ludic.recipes.sft import SFTConfig

    cfg = parse_config(SFTConfig, ["--model", "m", "--lora-rank", "4", "--no-full-finetune", "--data", "a.jsonl",
                                   "--run-dir", "r", "--lr", "0.5", "--device", "cpu"])
    assert (cfg.model, cfg.lora_rank, cfg.full_finetune, cfg.data, cfg.run_dir, cfg.trainer.lr, cfg.device) == (
        "m", 4, False, "a.jsonl", "r", 0.5, "cpu")
    assert cfg.lora_settings().rank == 4 and SFTConfig().lora_settings() is None  # SFT trains all weights by default
    assert SFTConfig().chat_template and not __import__("ludic.recipes.dpo", fromlist=["x"]).DPOTrainConfig().chat_template


def test_eval_games_takes_the_vllm_server_flags():
    """``ludic eval games --inference vllm`` used to reach the vLLM client without --start-server, --host
    and --port (AttributeError): EvalGamesConfig had ``inference`` but not the rest of the block."""
    from ludic.recipes.games import EvalGamesConfig

    cfg = parse_config(EvalGamesConfig, ["--inference", "vllm", "--port", "9001", "--host", "10.0.0.2"])
    assert (cfg.inference, cfg.start_server, cfg.host, cfg.port) == ("vllm", False, "10.0.0.2", 9001)


def test_run_dir_and_policy_helpers(tmp_path, monkeypatch):
    from ludic.recipes.env import TrainEnvConfig

    assert blocks.RunBlock(run_dir=str(tmp_path / "r")).resolve_run_dir("x") == tmp_path / "r"
    monkeypatch.chdir(tmp_path)
    assert blocks.RunBlock().resolve_run_dir("env").name.startswith("env-")
    seen = {}
    monkeypatch.setattr("ludic.training.lora.load_policy", lambda name, **kw: seen.update(name=name, **kw) or (1, 2))
    cfg = TrainEnvConfig(model="m", adapter="a", dtype="float32", device="cpu", seed=3, lora_rank=4)
    blocks.load_policy_for(cfg)
    assert (seen["name"], seen["adapter"], seen["dtype"], seen["device"], seen["seed"], seen["lora"].rank) == (
        "m", "a", "float32", "cpu", 3, 4)
    blocks.load_policy_for(cfg, model="other", adapter=None)
    assert (seen["name"], seen["adapter"]) == ("other", None)


def test_the_entropy_bonus_is_a_flag_of_every_grpo_command_and_reaches_the_loss():
    """``LossConfig.entropy_coef`` (a bonus against collapsing onto one answer) had no flag: ``ludic train env``
    could not ask for it, though ``algorithm_for`` reads it from a run config."""
    from ludic.recipes.env import TrainEnvConfig
    from ludic.recipes.qa import TrainQAConfig
    from ludic.training.algorithms import algorithm_for

    for cls in (TrainEnvConfig, TrainQAConfig):
        cfg = parse_config(cls, ["--entropy-coef", "0.01", "--kl-coef", "0.1"])
        loss = algorithm_for(cfg).loss
        assert (loss.entropy_coef, loss.kl_coef, loss.needs_entropy) == (0.01, 0.1, True)
        assert algorithm_for(cls()).loss.entropy_coef == 0.0  # off by default
