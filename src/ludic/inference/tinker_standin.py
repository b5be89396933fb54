"""A local STAND-IN for the Tinker service, for offline runs and tests. It is not Tinker.

The hosted service cannot be reached from here, and ``skyrl-tx`` (the open implementation) needs
``transformers<5``, ``uv`` and a wire-format shim to serve this SDK (see the issue note). So this
server speaks the wire format of the official ``tinker`` SDK (0.38: JSON requests, protobuf
``forward_backward`` requests and protobuf sample / forward-backward results, built from the SDK's own
``tinker.proto.tinker_public_pb2``) and backs it with one transformers model and a peft LoRA on CPU:

    python -m ludic.inference.tinker_standin --model <folder> --port 8011
    TINKER_API_KEY=tml-local python examples/tic_tac_toe/train_tic_tac_toe_tinker.py --base-url http://127.0.0.1:8011

What it implements: sessions, server capabilities, ``create_model`` (LoRA; rank, seed),
``forward_backward`` / ``forward`` with ``cross_entropy``, ``importance_sampling`` and ``ppo`` (sums over
tokens, as Tinker documents), ``optim_step`` (Adam with the request's betas, eps, weight decay and
clipping), ``save_weights_for_sampler`` (a snapshot of the adapter), sampling sessions on a snapshot or
the base model, ``asample`` and ``retrieve_future``. Requests run when they arrive; futures are
answered from memory. One base model per server; each training client is its own named adapter.
"""


import argparse
import uuid
from typing import Any

import numpy as np
import torch

CLIP = (0.8, 1.2)
"""PPO ratio clip (Tinker's default thresholds); loss_fn_config clip_low_threshold / clip_high_threshold."""


class StandInState:
    """The model, its LoRA adapters (one per ``create_model``), snapshots and finished futures."""

    def __init__(self, model_path: str, dtype: str = "float32") -> None:
        from ludic.inference.models import load_model, load_tokenizer

        self.model_path = model_path
        self.tokenizer = load_tokenizer(model_path)
        self.base = load_model(model_path, dtype=dtype)
        self.peft: Any = None  # the base model under peft, one named adapter per create_model
        self.models: dict[str, dict[str, Any]] = {}  # model_id -> {rank, optimizer}
        self.snapshots: dict[str, tuple[str | None, dict[str, torch.Tensor] | None]] = {}  # session -> (model_id, adapter)
        self.futures: dict[str, tuple[str, Any]] = {}  # request_id -> ("json" | "proto", payload)

    # -- training ---------------------------------------------------------------------------------
    def create_model(self, rank: int, seed: int | None) -> str:
        """A new LoRA adapter (named by its model id) on the shared base model."""
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(seed or 0)
        cfg = LoraConfig(r=rank, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0)
        mid = f"standin-{uuid.uuid4().hex[:8]}"
        if self.peft is None:
            self.peft = get_peft_model(self.base, cfg, adapter_name=mid)
        else:
            self.peft.add_adapter(mid, cfg)
        self.models[mid] = {"rank": rank, "optimizer": None}
        return mid

    def activate(self, model_id: str) -> Any:
        """The peft model with ``model_id``'s adapter active (the only one with gradients)."""
        self.peft.set_adapter(model_id)
        return self.peft

    def adapter_state(self, model_id: str) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.peft.state_dict().items() if f".{model_id}." in k}

    def forward_backward(self, model_id: str, req: Any) -> bytes:
        from tinker.proto import tinker_public_pb2 as pb

        peft = self.activate(model_id)
        cfg = {k: v.number for k, v in req.loss_fn_config_v2.items()} or dict(req.loss_fn_config)
        lo, hi = cfg.get("clip_low_threshold", CLIP[0]), cfg.get("clip_high_threshold", CLIP[1])
        outputs: dict[str, list[np.ndarray]] = {"logprobs": [], "elementwise_loss": []}
        total = 0.0
        peft.train()
        for datum in req.data:
            tokens = np.concatenate([np.frombuffer(c.encoded_text.tokens, dtype=np.int32) for c in datum.model_input])
            inputs = {name: _tensor(t) for name, t in datum.loss_fn_inputs.items()}
            ids = torch.tensor(tokens, dtype=torch.long)[None]
            with torch.set_grad_enabled(not req.forward_only):
                logits = peft(input_ids=ids).logits[0].float()
                target = torch.as_tensor(inputs["target_tokens"], dtype=torch.long)
                logp = torch.log_softmax(logits, -1).gather(-1, target[:, None])[:, 0]
                if req.loss_fn == "cross_entropy":
                    per_token = -torch.as_tensor(inputs["weights"]) * logp
                elif req.loss_fn in ("importance_sampling", "ppo"):
                    adv = torch.as_tensor(inputs["advantages"])
                    ratio = torch.exp(logp - torch.as_tensor(inputs["logprobs"]))
                    per_token = -ratio * adv
                    if req.loss_fn == "ppo":
                        per_token = torch.maximum(per_token, -ratio.clamp(lo, hi) * adv)
                else:
                    raise ValueError(f"the stand-in implements cross_entropy, importance_sampling and ppo, "
                                     f"not {req.loss_fn!r}")
                loss = per_token.sum()
                if not req.forward_only:
                    loss.backward()
            total += float(loss.detach())
            outputs["logprobs"].append(logp.detach().numpy().astype(np.float32))
            outputs["elementwise_loss"].append(per_token.detach().numpy().astype(np.float32))
        out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics={"loss:sum": total})
        rec = out.loss_fn_outputs.add()
        rec.num_datums = len(req.data)
        for name, arrays in outputs.items():
            offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
            rec.fields[name].CopyFrom(pb.BatchedTensor(dtype=pb.DTYPE_FLOAT32, data=b"".join(a.tobytes() for a in arrays),
                                                       offsets=offsets.tobytes()))
        return out.SerializeToString()

    def optim_step(self, model_id: str, adam: dict[str, Any]) -> dict[str, Any]:
        m = self.models[model_id]
        params = [p for n, p in self.activate(model_id).named_parameters() if f".{model_id}." in n]
        if m["optimizer"] is None:
            m["optimizer"] = torch.optim.AdamW(params, lr=1e-4)
        opt = m["optimizer"]
        for g in opt.param_groups:
            g.update(lr=adam.get("learning_rate", 1e-4), betas=(adam.get("beta1", 0.9), adam.get("beta2", 0.95)),
                     eps=adam.get("eps", 1e-12), weight_decay=adam.get("weight_decay", 0.0))
        clip = adam.get("grad_clip_norm", 0.0)
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        opt.step()
        opt.zero_grad(set_to_none=True)
        return {"metrics": {"grad_norm:mean": float(norm)}}

    def snapshot(self, model_id: str) -> str:
        sid = f"sampler-{uuid.uuid4().hex[:8]}"
        self.snapshots[sid] = (model_id, self.adapter_state(model_id))
        return sid

    # -- sampling ---------------------------------------------------------------------------------
    def sample(self, session: str, prompt: list[int], n: int, params: dict[str, Any]) -> bytes:
        from tinker.proto import tinker_public_pb2 as pb

        from ludic.inference.client import SamplingParams
        from ludic.inference.transformers_engine import TransformersEngine

        model_id, adapter = self.snapshots[session]
        stops = params.get("stop") or []
        stop_strings = tuple(s for s in stops if isinstance(s, str))
        stop_ids = {int(s) for s in stops if isinstance(s, int)}
        seed = params.get("seed")
        sampling = [SamplingParams(temperature=float(params.get("temperature", 1.0)), top_p=float(params.get("top_p", 1.0)),
                                   top_k=max(0, int(params.get("top_k", -1))), max_tokens=int(params.get("max_tokens") or 64),
                                   stop=stop_strings, seed=None if seed is None else int(seed) + i) for i in range(n)]
        if model_id is None:  # the base model: adapters switched off
            if self.peft is None:
                replies = TransformersEngine(self.base, self.tokenizer).generate([prompt] * n, sampling)
            else:
                with self.peft.disable_adapter():
                    replies = TransformersEngine(self.peft, self.tokenizer).generate([prompt] * n, sampling)
        else:
            peft = self.activate(model_id)
            live = self.adapter_state(model_id)
            peft.load_state_dict(adapter, strict=False)
            try:
                engine = TransformersEngine(peft, self.tokenizer)
                if stop_ids:
                    engine.stop_ids = set(engine.stop_ids) | stop_ids
                replies = engine.generate([prompt] * n, sampling)
            finally:
                peft.load_state_dict(live, strict=False)
        out = pb.SampleResponse()
        for r in replies:
            seq = out.sequences.add()
            seq.stop_reason = pb.STOP_REASON_LENGTH if r.trace.finish_reason.value == "length" else pb.STOP_REASON_STOP
            seq.tokens = np.asarray(r.trace.completion_ids, dtype=np.int32).tobytes()
            seq.logprobs = np.asarray(r.trace.logprobs, dtype=np.float32).tobytes()
        return out.SerializeToString()

    def promise(self, kind: str, payload: Any, **extra: Any) -> dict[str, Any]:
        rid = uuid.uuid4().hex
        self.futures[rid] = (kind, payload)
        while len(self.futures) > 4096:  # the oldest answers go first
            self.futures.pop(next(iter(self.futures)))
        return {"request_id": rid, **extra}


def _tensor(t: Any) -> np.ndarray:
    from tinker.proto import tinker_public_pb2 as pb

    dtype = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}[t.dtype]
    return np.frombuffer(t.dense, dtype=dtype).copy()


def make_app(state: StandInState) -> Any:
    """The FastAPI app: the SDK's paths under ``/api/v1``."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
    from tinker.proto import tinker_public_pb2 as pb

    app = FastAPI(title="Tinker stand-in (Ludic; not the Tinker service)")

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message, "category": "user"}, status_code=status)

    @app.post("/api/v1/client/config")
    async def client_config() -> dict:
        return {"pjwt_auth_enabled": False, "proto_compress_fwdbwd": False}

    @app.post("/api/v1/create_session")
    async def create_session() -> dict:
        return {"session_id": f"session-{uuid.uuid4().hex[:8]}", "type": "create_session"}

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat() -> dict:
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/telemetry")
    async def telemetry() -> dict:
        return {"status": "accepted"}

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities() -> dict:
        return {"supported_models": [{"model_name": state.model_path, "trainable": True, "sampleable": True}]}

    @app.post("/api/v1/create_model")
    async def create_model(request: Request) -> Any:
        body = await request.json()
        if body.get("base_model") != state.model_path:
            return error(400, f"this stand-in serves {state.model_path!r}, not {body.get('base_model')!r}")
        lora = body.get("lora_config") or {}
        mid = state.create_model(int(lora.get("rank", 32)), lora.get("seed"))
        return state.promise("json", {"model_id": mid, "type": "create_model"}, model_id=mid)

    @app.post("/api/v1/get_info")
    async def get_info(request: Request) -> dict:
        mid = (await request.json())["model_id"]
        rank = state.models[mid]["rank"]
        return {"model_id": mid, "model_data": {"base_model": state.model_path, "model_name": state.model_path},
                "is_lora": True, "lora_rank": rank, "model_name": state.model_path, "type": "get_info"}

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request) -> Any:
        if "protobuf" not in request.headers.get("content-type", ""):
            return error(415, "forward_backward takes application/x-protobuf (the SDK's ForwardBackwardRequest)")
        req = pb.ForwardBackwardRequest()
        req.ParseFromString(await request.body())
        if req.model_id not in state.models:
            return error(404, f"unknown model {req.model_id!r}")
        try:
            payload = state.forward_backward(req.model_id, req)
        except (ValueError, KeyError) as e:
            return error(400, f"forward_backward: {e}")
        return state.promise("proto", payload, model_id=req.model_id)

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request) -> Any:
        body = await request.json()
        if body.get("model_id") not in state.models:
            return error(404, f"unknown model {body.get('model_id')!r}")
        return state.promise("json", state.optim_step(body["model_id"], body.get("adam_params") or {}),
                             model_id=body["model_id"])

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request: Request) -> Any:
        body = await request.json()
        mid = body.get("model_id")
        if mid not in state.models:
            return error(404, f"unknown model {mid!r}")
        sid = state.snapshot(mid)
        path = f"tinker://{mid}/sampler_weights/{body['path']}" if body.get("path") else None
        if path:
            state.snapshots[path] = state.snapshots[sid]
        return state.promise("json", {"path": path, "sampling_session_id": sid, "type": "save_weights_for_sampler"},
                             model_id=mid)

    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request) -> Any:
        body = await request.json()
        sid = f"sampler-{uuid.uuid4().hex[:8]}"
        if body.get("model_path"):
            if body["model_path"] not in state.snapshots:
                return error(404, f"unknown weights {body['model_path']!r}")
            state.snapshots[sid] = state.snapshots[body["model_path"]]
        elif body.get("base_model") == state.model_path:
            state.snapshots[sid] = (None, None)
        else:
            return error(400, f"this stand-in serves {state.model_path!r}, not {body.get('base_model')!r}")
        return {"sampling_session_id": sid, "type": "create_sampling_session"}

    @app.post("/api/v1/asample")
    async def asample(request: Request) -> Any:
        body = await request.json()
        session = body.get("sampling_session_id")
        if session not in state.snapshots:
            return error(404, f"unknown sampling session {session!r}")
        prompt = [int(t) for c in body["prompt"]["chunks"] for t in c.get("tokens", [])]
        n = int(body.get("num_samples", 1))
        payload = state.sample(session, prompt, n, body.get("sampling_params") or {})
        promise = state.promise("proto", payload)
        return {**promise, "sample_sequence_ids": [f"{promise['request_id']}-{i}" for i in range(n)]}

    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request) -> Any:
        rid = (await request.json()).get("request_id")
        if rid not in state.futures:
            return error(404, f"unknown request {rid!r}")
        kind, payload = state.futures[rid]  # kept: the SDK may ask again after a dropped connection
        if kind == "proto":
            return Response(content=payload, media_type="application/x-protobuf")
        return payload

    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    ap = argparse.ArgumentParser(description="A local stand-in for the Tinker service (not Tinker itself).")
    ap.add_argument("--model", default=None, help="model folder (default: the packaged SmolLM2-135M-Instruct)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args(argv)
    from ludic.inference.models import resolve_model

    state = StandInState(resolve_model(args.model), dtype=args.dtype)
    uvicorn.run(make_app(state), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()

