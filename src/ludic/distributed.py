"""Process groups, in one neutral place: set-up for ``torchrun`` (gloo on CPU, NCCL on GPUs)
and the rank checks the trainer, checkpoints and weight publishers share.

Data parallelism in Ludic is plain: every rank computes gradients on its own
shard with whole-batch normalisers, and the trainer all-reduces (sums) the
gradients, which gives exactly the single-process full-batch gradient.
"""

from __future__ import annotations

import os
import sys

import torch

_JOINED = False  # this process joined a torchrun group (init_distributed)


def is_distributed() -> bool:
    """True when torch.distributed is initialised (launched by torchrun)."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def is_sharded(model) -> bool:
    """Whether ``model`` was sharded by FSDP2's ``fully_shard`` (``training.fsdp.shard_model``), which
    renames the module class to ``FSDP<name>``. Here, not in ``training.fsdp``, so the scoring and
    checkpoint code can ask without importing FSDP."""
    return type(model).__name__.startswith("FSDP")


def is_rank0() -> bool:
    """True unless torch.distributed is initialised and this is not rank 0."""
    return not is_distributed() or torch.distributed.get_rank() == 0


def init_distributed() -> tuple[int, int]:
    """Join the process group if launched by torchrun; returns (rank, world_size)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    import torch.distributed as dist

    if not dist.is_initialized():
        from ludic.inference.models import resolve_device

        # NCCL where the policy goes to the GPU; gloo on CPU, also on a GPU machine with LUDIC_DEVICE=cpu
        backend = "nccl" if resolve_device("auto").startswith("cuda") else "gloo"
        if backend == "nccl":
            local, gpus = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
            if local >= gpus:
                raise RuntimeError(
                    f"torchrun started local rank {local} on a machine with {gpus} GPU(s): NCCL needs one GPU per "
                    f"rank (--nproc_per_node at most {gpus}), or set LUDIC_DEVICE=cpu to train on CPUs over gloo")
            torch.cuda.set_device(local)
        dist.init_process_group(backend=backend)
    global _JOINED
    _JOINED = True
    return dist.get_rank(), dist.get_world_size()


def shutdown_distributed() -> None:
    """Wait for every rank, then destroy the process group (call once per worker, at its end)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def exit_worker(code: int = 0) -> None:
    """End a torchrun worker that has finished (after ``shutdown_distributed``) without interpreter
    finalisation; a no-op in a process that never joined a group.

    ``destroy_process_group`` drops torch's own references, but a sharded model's device mesh still
    holds the gloo group. It is then destroyed during interpreter shutdown, racing gloo's static
    state, and the process can abort with "terminate called without an active exception" (SIGABRT)
    after all its work is done: a rare, timing-dependent failure of a run that succeeded. Output is
    flushed first, so nothing written is lost."""
    if not _JOINED:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def collective_device() -> torch.device:
    """Where a tensor for a collective must live: the current GPU under NCCL (which has no CPU
    tensors: "No backend type associated with device type cpu"), else the CPU (gloo)."""
    if is_distributed() and torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def reduce_floats(values: list[float], op: str = "sum") -> list[float]:
    """``values`` reduced element-wise over ranks (``op``: sum or max; float64, any backend). Every
    rank must call it with as many values; outside a group it returns them unchanged."""
    if not is_distributed():
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=collective_device())
    torch.distributed.all_reduce(t, op={"sum": torch.distributed.ReduceOp.SUM,
                                        "max": torch.distributed.ReduceOp.MAX}[op])
    return t.tolist()


def broadcast_float(value: float) -> float:
    """Rank 0's ``value`` on every rank (float64, any backend)."""
    if not is_distributed():
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=collective_device())
    torch.distributed.broadcast(t, src=0)
    return float(t.item())


def broadcast_object(obj):
    """Rank 0's value on every rank (small JSON-like objects only)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]
