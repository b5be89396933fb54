"""InProcessPublisher with a TransformersEngine (tiny random model): no state of its own."""

from __future__ import annotations

from ludic.inference.models import load_tokenizer
from ludic.inference.publish import InProcessPublisher
from ludic.inference.transformers_engine import TransformersEngine


def test_transformers_engine_has_no_server_version(tiny_model_dir) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    engine = TransformersEngine(model, load_tokenizer(str(tiny_model_dir)))
    pub = InProcessPublisher(engine, every_n_steps=4)
    assert pub.server_version() is None
    assert pub.publish(model, 3)["kind"] == "shared" and engine.policy_version == 3  # first: always due
    assert pub.publish(model, 5)["skipped"] == "not due" and engine.policy_version == 3
    pub.publish(model, 0)  # no state of its own to protect: a lower version is taken
    assert engine.policy_version == 0
