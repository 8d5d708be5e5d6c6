"""Device-placement check for the gpu dry run: a second "device" on a CPU.

The gpu profile's dry run (``companion.notebook.profile``) computes on the CPU, so a tensor that a
chapter forgets to move to ``P.device`` goes unnoticed there, and fails on a GPU with "Expected all
tensors to be on the same device". With ``COMPANION_DEVICE_CHECK=1`` the dry run tells the two
apart: ``P.device`` becomes ``cpu:0`` (still the CPU, but a device object of its own), and a torch
function mode, ``DeviceCheck``, follows which tensors live "on the device".

- A tensor is on the device when its storage is marked. Storages are marked by ``x.to(P.device)``
  (also ``model.to(P.device)``: each parameter's ``.data`` becomes such a copy), by factories
  called with ``device=P.device`` (or ``device=x.device`` of a marked ``x``: a marked tensor reports
  ``cpu:0`` as its device), and as the results of operations on marked tensors (gradients and
  optimizer state included). ``x.cpu()`` / ``x.to("cpu")`` of a marked tensor is an unmarked copy.
- An operation fails (``DevicePlacementError``, a RuntimeError naming the operation) where CUDA
  would fail: it mixes a marked tensor with an unmarked tensor of one or more dimensions (0-dim
  CPU tensors are scalars, which CUDA accepts); a CPU tensor is indexed with marked indices (a
  marked tensor may be indexed with CPU indices, as on CUDA); a marked tensor goes to NumPy.
- Copies between the two are fine, as on a GPU: ``.to``, ``.cpu``, ``copy_``, ``type_as``,
  ``torch.tensor`` / ``as_tensor`` / ``new_tensor``, assigning ``.data``; so are the ops that read
  only another tensor's shape (``view_as``, ``expand_as``, ``reshape_as``).
- Code that runs outside the mode's sight (inside ``torch.compile``'d regions, the autograd
  engine) is not checked; its results are marked where they come out through an operation.

A storage, not a tensor object, carries the mark: views, ``nn.Parameter(x)`` and ``p.data = x``
share their storage, so they share the mark, as they share the device on a GPU.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

__all__ = ["DEVICE", "DeviceCheck", "DevicePlacementError", "activate", "active", "on_device"]

DEVICE = torch.device("cpu", 0)  # the profile's device in a checked dry run: the CPU, told apart
_CPU = torch.device("cpu")
_MARK = "_companion_on_device"


class DevicePlacementError(RuntimeError):
    """An operation that would mix devices on a GPU."""


def on_device(t) -> bool:
    """True when ``t`` is a tensor whose storage lives on the (pretend) profile device."""
    if not isinstance(t, torch.Tensor):
        return False
    try:
        return getattr(t.untyped_storage(), _MARK, False)
    except (RuntimeError, NotImplementedError):  # no storage (sparse, nested, fake tensors)
        return False


def _mark(t) -> None:
    if isinstance(t, torch.Tensor):
        try:
            setattr(t.untyped_storage(), _MARK, True)
        except (RuntimeError, NotImplementedError):
            pass


def _is_device(d) -> bool:
    """``d`` names the profile's device (``cpu:0``), as a torch.device or a string."""
    return isinstance(d, (str, torch.device)) and str(d) == str(DEVICE)


def _real(x):
    """A device argument as plain torch sees it: the profile's device is the CPU."""
    return _CPU if _is_device(x) else x


def _real_kwargs(kwargs: dict) -> dict:
    return {k: _real(v) if k == "device" else v for k, v in kwargs.items()}


def _name(func) -> str:
    owner = getattr(func, "__self__", None)  # a property: torch.Tensor.grad.__get__
    if owner is not None and type(owner).__name__ == "getset_descriptor":
        return f"Tensor.{owner.__name__}.{func.__name__}"
    qual = getattr(func, "__qualname__", getattr(func, "__name__", repr(func)))
    return qual.replace("TensorBase.", "Tensor.").replace("_VariableFunctionsClass.", "torch.")


def _fresh(result, source):
    """``result`` with a storage of its own: a copy to another device is never a view of its source."""
    if isinstance(result, torch.Tensor) and result.untyped_storage() is source.untyped_storage():
        return result.clone()
    return result


def _describe(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}"


_COPIES = {"Tensor.copy_", "Tensor.data.__set__", "Tensor.grad.__set__", "torch.tensor", "torch.as_tensor",
           "Tensor.new_tensor", "Tensor.set_"}
# read only another tensor's shape or type
_SHAPE_OF_OTHER = {"Tensor.view_as", "Tensor.expand_as", "Tensor.reshape_as", "torch.is_same_size",
                   "torch._has_compatible_shallow_copy_type", "Tensor.is_set_to"}
_KEEPS_SELF = {"Tensor.copy_", "Tensor.set_", "Tensor.new_tensor"}  # the result is where self is
_INDEXING = {"Tensor.__getitem__", "Tensor.__setitem__", "Tensor.index_put_", "Tensor.index_put",
             "torch.index_put", "torch.index_put_"}
_TO_NUMPY = {"Tensor.numpy", "Tensor.__array__"}
_QUIET = {"Tensor.__repr__", "Tensor.__str__", "Tensor.__format__"}  # printing: not computation


class DeviceCheck(TorchFunctionMode):
    """The torch function mode that marks and checks (see the module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.compiler.is_compiling():
            return func(*args, **kwargs)
        name = _name(func)
        if name == "Tensor.device.__get__":
            return DEVICE if on_device(args[0]) else func(*args)
        if name in _QUIET:
            return func(*args, **kwargs)
        if name in ("Tensor.to", "Tensor.type_as"):
            return self._to(func, args, kwargs)
        if name == "Tensor.cpu":
            return _fresh(func(*args, **kwargs), args[0]) if on_device(args[0]) else func(*args, **kwargs)
        if name in _TO_NUMPY and on_device(args[0]):
            raise DevicePlacementError(
                f"device check: {name} of a tensor on the profile device {_describe(args[0])}: on a GPU, "
                "\"can't convert cuda:0 device type tensor to numpy\"; call .cpu() first")
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if name in _INDEXING:
            self._check_indexing(name, args)
        elif name not in _COPIES and name not in _SHAPE_OF_OTHER and not name.endswith("__set__"):
            self._check_mixing(name, tensors)
        device = kwargs.get("device")
        result = func(*args, **_real_kwargs(kwargs))
        if device is not None:
            marked = _is_device(device)
        elif name in _SHAPE_OF_OTHER or name in _INDEXING or name in _KEEPS_SELF:
            marked = on_device(args[0])
        else:
            marked = any(on_device(t) for t in tensors)
        if device is not None and marked and isinstance(result, torch.Tensor):
            for t in tensors:  # torch.as_tensor(x, device=P.device) of a CPU x: a copy, not x itself
                if not on_device(t):
                    result = _fresh(result, t)
        if marked and not name.endswith("__set__"):
            for out in tree_leaves(result):
                _mark(out)
        return result

    @staticmethod
    def _check_mixing(name: str, tensors: list) -> None:
        marked = [t for t in tensors if on_device(t)]
        if not marked:
            return
        for t in tensors:
            if not on_device(t) and t.dim() > 0:
                raise DevicePlacementError(
                    f"device check: {name} mixes a tensor on the profile device {_describe(marked[0])} "
                    f"with a tensor left on the CPU {_describe(t)}: on a GPU, \"Expected all tensors to be "
                    "on the same device\"; create it with device=P.device or move it with .to(P.device)")

    @staticmethod
    def _check_indexing(name: str, args) -> None:
        # CUDA takes CPU indices for a tensor on the GPU, not GPU indices for a tensor on the CPU
        target = args[0]
        if on_device(target) or not isinstance(target, torch.Tensor):
            return
        index = [t for t in tree_leaves(args[1:2]) if isinstance(t, torch.Tensor)]
        if any(on_device(i) for i in index):
            raise DevicePlacementError(
                f"device check: {name} indexes a tensor left on the CPU {_describe(target)} with indices on "
                "the profile device: on a GPU, \"indices should be either on cpu or on the same device as the "
                "indexed tensor\"; move the indices to its device or the tensor to P.device")

    @staticmethod
    def _to(func, args, kwargs):
        source, rest = args[0], args[1:]
        if rest and isinstance(rest[0], torch.Tensor):  # x.to(other) / x.type_as(other): other's device
            target = on_device(rest[0])
        elif any(_is_device(x) for x in (*rest, kwargs.get("device"))):
            target = True
        else:
            parse = {k: v for k, v in kwargs.items() if k != "copy"}  # _parse_to takes no copy=
            device = torch._C._nn._parse_to(*rest, **parse)[0]
            target = on_device(source) if device is None else False
        result = func(source, *map(_real, rest), **_real_kwargs(kwargs))
        if target != on_device(source):
            result = _fresh(result, source)
        if target:
            _mark(result)
        return result


_active: DeviceCheck | None = None


def activate() -> DeviceCheck:
    """Enter the check for the rest of the process (a notebook kernel); once, however often called."""
    global _active
    if _active is None:
        _active = DeviceCheck()
        _active.__enter__()
    return _active


def active() -> bool:
    return _active is not None
