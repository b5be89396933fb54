"""One switch for Ludic's hand-written CPU fast path.

Ludic runs some hot loops itself on CPU, each measured against the stock code in ``benchmarks/``
and checked against it in the tests (``tests/test_fastpath.py`` on the packaged model's shapes):

    inference.decode.StaticDecoder       one-token decode steps over a preallocated cache   (engine)
    inference.decode.cast_adapter_view   LoRA linears fused for decoding                    (engine)
    inference.decode.pack                oneDNN-prepacked weights for those matmuls          (engine)
    inference.models.cpu_bf16_attention  a bf16 model's attention computed in fp32            (both)
    training.packed                      the trainer's flat, prefix-shared scoring pass      (trainer)
    training.lora._LoraLinear            LoRA linears with a hand-written backward           (trainer)
    training.token_logp._TokenLogp       token log-probs with a hand-written backward        (trainer)

Off, everything goes through the stock code: transformers' forward with its dynamic cache and
``sdpa`` attention, peft's LoRA forward, autograd's ``log_softmax``. Turn it off with

    LUDIC_FAST_PATH=0                    the environment, for any command or script
    --no-fast-path                       a training command's flag (``TrainerConfig.fast_path``;
                                         ``RecipeConfig.fast_path`` for ``ludic recipe tictactoe``)
    ludic.train(..., fast_path=False)    the Python API: the whole run, its evaluations included
    with fastpath.scoped(False): ...     a block of Python code (the Trainer wraps its steps and
                                         ``evaluate`` in it, per ``TrainerConfig.fast_path``)

Switching off always wins: the fast path runs only where nothing turned it off. Even on, each piece
runs only on the device it was written and measured for, the CPU: a CUDA run goes through the stock
code (``enabled(device)``).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

ENV = "LUDIC_FAST_PATH"
_off_scopes = 0
"""How many ``scoped(False)`` blocks are open (``set_off`` counts as one that never closes)."""


def env_allows() -> bool:
    """False when ``LUDIC_FAST_PATH`` is 0 / false / no / off."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def enabled(device: Any = None) -> bool:
    """Whether the hand-written fast path may run (on ``device``: only a CPU qualifies)."""
    if _off_scopes or not env_allows():
        return False
    if device is None:
        return True
    return getattr(device, "type", str(device).split(":")[0]) == "cpu"


@contextlib.contextmanager
def scoped(on: bool = True) -> Iterator[None]:
    """Run the block with the fast path off when ``on`` is False (``on=True`` changes nothing: it
    cannot turn on what the environment or an enclosing block turned off)."""
    global _off_scopes
    if on:
        yield
        return
    _off_scopes += 1
    try:
        yield
    finally:
        _off_scopes -= 1


def set_off() -> None:
    """Turn the fast path off for the rest of this process (a command's ``--no-fast-path``)."""
    global _off_scopes
    _off_scopes += 1


def describe(device: Any = "cpu") -> str:
    """"on" / "off (why)" for logs and reports."""
    if not env_allows():
        return f"off ({ENV}={os.environ.get(ENV)})"
    if _off_scopes:
        return "off (--no-fast-path)"
    return "on" if enabled(device) else f"off (stock code on {device})"
