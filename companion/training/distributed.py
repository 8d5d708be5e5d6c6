"""Several processes and devices: joining torchrun's process group, checking a device name, FSDP2 sharding.

What this module provides
- ``setup_distributed() -> (rank, world_size, local_rank)``: torchrun sets RANK / WORLD_SIZE /
  LOCAL_RANK; gloo on CPU, nccl on GPU; (0, 1, 0) without torchrun.
- ``check_device(name) -> torch.device``: a device name that exists here, or a one-line ValueError.
- ``transformer_blocks(model)``: the blocks FSDP shards one by one; ``shard(model, device, world)``
  applies ``fully_shard`` to them and to the root; ``full_options()``: gather full tensors to process 0.
"""

from __future__ import annotations

import os

import torch
from torch import nn

__all__ = ["setup_distributed", "check_device", "transformer_blocks", "shard", "full_options"]


def setup_distributed() -> tuple[int, int, int]:
    """(rank, world_size, local_rank). Joins the process group torchrun describes (RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR/PORT) if it is not joined yet: nccl when CUDA is present, else gloo.
    Without torchrun and without an initialised group: (0, 1, 0)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend=backend)
    return dist.get_rank(), dist.get_world_size(), local_rank


def check_device(name: str | torch.device) -> torch.device:
    """``torch.device(name)`` when that device exists here; otherwise a one-line ValueError (an
    unknown name, CUDA or MPS asked for where it is absent, a CUDA index beyond the devices present)."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device must be cpu, cuda, cuda:N or mps; got {name!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(name)!r} asked for, but CUDA is not available here (torch.cuda.is_available() "
                             "is False); use cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {str(name)!r} asked for, but only {torch.cuda.device_count()} CUDA device(s) are present")
    elif device.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise ValueError(f"device {str(name)!r} asked for, but MPS is not available here; use cpu")
    elif device.type != "cpu":
        raise ValueError(f"device must be cpu, cuda, cuda:N or mps; got {str(name)!r}")
    return device


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The items of every ``nn.ModuleList`` in ``model`` that hold parameters, outermost lists first and
    without looking inside an item: the transformer blocks of the book's models (GPT's and Decoder's
    layers, the encoder's and decoder's layers of the 2017 model), which FSDP shards one by one."""
    out: list[nn.Module] = []

    def walk(module: nn.Module) -> None:
        for child in module.children():
            if isinstance(child, nn.ModuleList):
                out.extend(item for item in child if next(item.parameters(), None) is not None)
            else:
                walk(child)

    walk(model)
    return out


def shard(model: nn.Module, device: torch.device, world: int, *, compute_dtype: torch.dtype | None = None,
          reduce_dtype: torch.dtype = torch.float32) -> None:
    """FSDP2: ``fully_shard`` each transformer block, then the root (in place: the parameters become
    DTensors holding 1/world of each tensor on this process).

    With a ``compute_dtype`` (bf16 or fp16) the mixed-precision policy is FSDP's own: each shard stays
    float32 (the master weights the optimizer updates), the all-gather before a block's forward and
    backward casts the parameters to ``compute_dtype`` (half the bytes on the wire and in memory), the
    gradients are reduce-scattered in ``reduce_dtype`` (float32 by default: a sum over processes in 16
    bits loses the small contributions), and the root's output (the logits) comes back in float32 so the
    loss is computed at full precision."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # pragma: no cover - torch < 2.6 or built without distributed
        raise ValueError(f"parallel='fsdp' needs torch.distributed.fsdp.fully_shard (FSDP2, torch >= 2.6); torch "
                         f"{torch.__version__} lacks it: use parallel='ddp'") from None
    mesh = init_device_mesh(device.type, (world,))
    policy = {}
    if compute_dtype is not None:
        policy = {"mp_policy": MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=reduce_dtype)}
    for block in transformer_blocks(model):
        fully_shard(block, mesh=mesh, **policy)
    if compute_dtype is not None:
        policy = {"mp_policy": MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=reduce_dtype,
                                                    output_dtype=torch.float32)}
    fully_shard(model, mesh=mesh, **policy)


def full_options():
    """Gather full tensors, on the CPU, to process 0 only (the others receive empty dicts)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)
