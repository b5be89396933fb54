"""Inference backends behind one ChatClient interface (heavy ones import lazily).

    TransformersEngine   in-process batched sampling on the trainer's own model (CPU default)
    VLLMChatClient       HTTP client for ``python -m ludic.inference.vllm_server`` (or plain vLLM)
    VLLMEngineClient     in-process ``vllm.LLM``
    publishers           push new weights / adapters to engines after optimizer steps
"""

from ludic._lazy import lazy_exports
from ludic.inference.client import ChatClient, ChatRequest, ChatResponse, SamplingParams

_LAZY = {
    "TransformersEngine": "ludic.inference.transformers_engine",
    "VLLMChatClient": "ludic.inference.vllm_client",
    "VLLMEngineClient": "ludic.inference.vllm_engine",
    "VLLMServerProcess": "ludic.inference.vllm_launcher",
    "WeightPublisher": "ludic.inference.publish",
    "VLLMAdapterPublisher": "ludic.inference.publish",
    "VLLMFullWeightsPublisher": "ludic.inference.publish",
    "InProcessPublisher": "ludic.inference.publish",
    "rank0_only": "ludic.inference.publish",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = ["ChatClient", "ChatRequest", "ChatResponse", "SamplingParams", *_LAZY]
