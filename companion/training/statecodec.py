"""Training state without pickle: nested Python objects (optimizer and scheduler state dicts, RNG
states) split into a JSON structure plus a flat tensor dict (``encode_state``), and back
(``decode_state``). A checkpoint stores the two as state.json and state.safetensors."""

from __future__ import annotations

import base64

import numpy as np
from torch import Tensor

__all__ = ["encode_state", "decode_state"]


def encode_state(obj) -> tuple[object, dict[str, Tensor]]:
    """Split a nested object into a JSON-able structure and a flat {name: tensor} dict.

    Tensors become ``{"__tensor__": name}``; tuples ``{"__tuple__": [...]}``; dicts with non-string keys
    ``{"__items__": [[key, value], ...]}``; NumPy arrays ``{"__ndarray__": [...], "dtype": ...}``;
    bytes ``{"__bytes__": base64}``. Anything else that JSON cannot hold raises ValueError.
    """
    tensors: dict[str, Tensor] = {}

    def enc(x, path: str):
        if isinstance(x, Tensor):
            tensors[path] = x.detach().to("cpu").contiguous().clone()
            return {"__tensor__": path}
        if isinstance(x, np.ndarray):
            return {"__ndarray__": x.tolist(), "dtype": str(x.dtype)}
        if isinstance(x, (bytes, bytearray)):
            return {"__bytes__": base64.b64encode(bytes(x)).decode()}
        if isinstance(x, dict):
            if all(isinstance(k, str) for k in x):
                return {k: enc(v, f"{path}.{k}") for k, v in x.items()}
            return {"__items__": [[k, enc(v, f"{path}.{k}")] for k, v in x.items()]}
        if isinstance(x, tuple):
            return {"__tuple__": [enc(v, f"{path}.{i}") for i, v in enumerate(x)]}
        if isinstance(x, list):
            return [enc(v, f"{path}.{i}") for i, v in enumerate(x)]
        if isinstance(x, (np.integer, np.floating, np.bool_)):
            return x.item()
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        raise ValueError(f"state at {path!r} has type {type(x).__name__}, which a checkpoint cannot store without pickle")

    return enc(obj, "s"), tensors


def decode_state(obj, tensors: dict[str, Tensor]):
    """Inverse of ``encode_state``. A reference to a tensor that ``tensors`` lacks, or a malformed
    structure, raises ValueError naming it."""

    def dec(x):
        if isinstance(x, list):
            return [dec(v) for v in x]
        if isinstance(x, dict):
            if "__tensor__" in x:
                name = x["__tensor__"]
                if not isinstance(name, str) or name not in tensors:
                    raise ValueError(f"the state references tensor {name!r}, which the state's tensor file does not hold")
                return tensors[name]
            try:
                if "__tuple__" in x:
                    return tuple(dec(v) for v in x["__tuple__"])
                if "__items__" in x:
                    return {k: dec(v) for k, v in x["__items__"]}
                if "__ndarray__" in x:
                    return np.asarray(x["__ndarray__"], dtype=x["dtype"])
                if "__bytes__" in x:
                    return base64.b64decode(x["__bytes__"])
            except (TypeError, KeyError, ValueError) as e:
                if isinstance(e, ValueError) and "references tensor" in str(e):
                    raise
                raise ValueError(f"the state has a malformed entry {str(x)[:80]!r}: {e}") from None
            return {k: dec(v) for k, v in x.items()}
        return x

    return dec(obj)
