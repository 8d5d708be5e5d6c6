"""Position information for a permutation-equivariant operator (chapters 2, 3 and 7).

What this module provides
- ``sinusoidal_table`` / ``SinusoidalPositions``: PE[p, 2i] = sin(p / 10000^(2i/d)),
  PE[p, 2i+1] = cos(p / 10000^(2i/d)) (Vaswani et al. 2017, section 3.5). The token embedding is
  multiplied by sqrt(d) before the table is added (``embed_scale``), as in the paper.
- ``LearnedPositions``: one trained vector per absolute position (GPT-1/2).
- ``RotaryEmbedding``: RoPE (Su et al. 2021). Each pair of channels (x_a, x_b) of a query or key at
  position m is rotated by the angle m * theta_i, theta_i = base^(-2i/d_h), so that
  <R_m q, R_n k> depends only on q, k and m - n. Context extension by position interpolation
  ("pi": theta_i / s), NTK-aware base change ("ntk": base * s^(d/(d-2))) and YaRN ("yarn":
  per-frequency blend of the two plus the attention temperature 0.1 ln s + 1 on q and k).
- ``rope_turns`` / ``ntk_base`` / ``yarn_temperature``: the quantities chapter 7 reasons with: the
  full turns r_i = L theta_i / (2 pi) of each pair over a context, the NTK-aware base
  b s^(d_h/(d_h-2)), and YaRN's factor 0.1 ln s + 1 on q and k.
- ``alibi_slopes`` / ``alibi_bias``: ALiBi (Press et al. 2022), score_ij - m_h |i - j| with
  geometric per-head slopes m_h; no embedding at all.

Every function takes ABSOLUTE positions (a 1-D integer tensor), never "0..T-1": with a KV cache
the new rows sit at cache.length + i (see shared DESIGN: the cache interface).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = [
    "sinusoidal_table",
    "SinusoidalPositions",
    "LearnedPositions",
    "embed_scale",
    "RotaryEmbedding",
    "rope_inverse_frequencies",
    "rotate_half",
    "value_range",
    "rope_turns",
    "ntk_base",
    "yarn_temperature",
    "ROPE_SCALINGS",
    "alibi_slopes",
    "alibi_bias",
]

ROPE_SCALINGS = (None, "pi", "ntk", "yarn", "yarn_hf", "llama3")


def compiling() -> bool:
    """True while torch.compile traces the code: value checks that read a tensor on the host (a
    data-dependent branch, a graph break) are skipped there: the caller of a compiled step checks its inputs."""
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(is_compiling is not None and is_compiling())


def _check_positions(positions: Tensor, limit: int | None = None, what: str = "positions", values: bool = True) -> None:
    """Shape and dtype always; the values (>= 0, < limit) unless ``values=False`` or while compiling.
    Reading values copies them to the host: on a GPU a device sync, which per-layer callers avoid."""
    if positions.dim() != 1 or positions.dtype in (torch.float16, torch.float32, torch.float64, torch.bfloat16):
        raise ValueError(f"{what} must be a 1-D integer tensor of absolute positions; got {positions.dtype} {tuple(positions.shape)}")
    if not values or not positions.numel() or compiling():
        return
    lo, hi = value_range(positions)
    if lo < 0:
        raise ValueError(f"{what} must be >= 0")
    if limit is not None and hi >= limit:
        raise ValueError(
            f"position {hi} is beyond the configured context (max_len={limit}); "
            f"positions must be < max_len, so sequences are at most max_len tokens long"
        )


def value_range(x: Tensor) -> tuple[int, int]:
    """(min, max) of a non-empty integer tensor, read on the host in one transfer (a device sync on
    a GPU: callers on a hot path read it only from CPU tensors). A few values (a decode step's) are
    read as a list, which costs less than a reduction."""
    if x.numel() <= 64:
        values = x.reshape(-1).tolist()
        return min(values), max(values)
    return tuple(torch.stack(torch.aminmax(x.reshape(-1))).tolist())


def embed_scale(d: int) -> float:
    """The sqrt(d) multiplier of the token embedding in the 2017 Transformer (section 3.4).

    With tied input/output embeddings the rows are small (init ~ 1/sqrt(d)); scaling by sqrt(d)
    brings them to the O(1) size of the sinusoidal table so that neither swamps the other.
    """
    return math.sqrt(d)


def sinusoidal_table(positions: Tensor, d: int, base: float = 10000.0) -> Tensor:
    """(T,) absolute positions -> (T, d) table with PE[p, 2i] = sin(p w_i), PE[p, 2i+1] = cos(p w_i),
    w_i = base^(-2i/d)."""
    if d < 2 or d % 2:
        raise ValueError(f"d must be even and >= 2 for the sinusoidal table (sin/cos pairs); got {d}")
    _check_positions(positions)
    positions = positions.cpu()  # a small table, built on the CPU, then moved with the module
    w = base ** (-torch.arange(0, d, 2, dtype=torch.float64, device="cpu") / d)  # (d/2,)
    angles = positions.to(torch.float64)[:, None] * w[None, :]  # (T, d/2); float64 keeps large p exact
    table = torch.empty(positions.shape[0], d, dtype=torch.float64, device="cpu")
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles)
    return table.to(torch.get_default_dtype())


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal table, precomputed for ``max_len`` positions (no parameters)."""

    def __init__(self, d: int, max_len: int):
        super().__init__()
        self.max_len = max_len
        self.register_buffer("table", sinusoidal_table(torch.arange(max_len, device="cpu"), d), persistent=False)

    def forward(self, positions: Tensor) -> Tensor:  # (T,) -> (T, d)
        _check_positions(positions, self.max_len, values=positions.device.type == "cpu")  # no GPU sync
        return self.table[positions]


class LearnedPositions(nn.Module):
    """A trained vector per absolute position p < max_len (GPT). Cannot extrapolate past max_len."""

    def __init__(self, d: int, max_len: int):
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.randn(max_len, d) * 0.02)

    def forward(self, positions: Tensor) -> Tensor:  # (T,) -> (T, d)
        _check_positions(positions, self.max_len, values=positions.device.type == "cpu")  # no GPU sync
        return self.weight[positions]


# ----------------------------------------------------------------------------- RoPE


def rope_inverse_frequencies(
    head_dim: int,
    base: float = 10000.0,
    scaling: str | None = None,
    factor: float = 1.0,
    original_max_len: int = 2048,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    *,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    truncate: bool = True,
    attention_factor: float | None = None,
    mscale: float = 0.0,
    mscale_all_dim: float = 0.0,
) -> tuple[Tensor, float]:
    """theta_i for i = 0..d_h/2-1 and the attention temperature factor, for each scaling scheme.

    - None:  theta_i = base^(-2i/d_h).
    - "pi":  theta_i / s. Positions are squeezed by s into the trained range (Chen et al. 2023).
    - "ntk": base' = base * s^(d_h/(d_h-2)). The lowest frequency is stretched by exactly s, the
             highest is unchanged, so local resolution survives without fine-tuning.
    - "yarn": each frequency is interpolated according to how many full turns r_i = L / lambda_i it
             makes over the original context L (lambda_i = 2 pi / theta_i): r < beta_slow -> PI
             (theta / s), r > beta_fast -> untouched, linear ramp in between. Logits are
             sharpened by (0.1 ln s + 1)^2, applied as a factor 0.1 ln s + 1 on both q and k.
    - "yarn_hf": YaRN as transformers (and the released gpt-oss / DeepSeek-V3 code) computes it. Same
             endpoints (theta_i / s below beta_slow turns, theta_i above beta_fast), but the ramp
             between them is linear in the channel index i, not in the turn count r_i:
             i_lo = floor(d_h ln(L / (2 pi beta_fast)) / (2 ln base)), i_hi = ceil(same with
             beta_slow) (no floor / ceil when ``truncate=False``, as in gpt-oss), clamped to
             [0, d_h - 1], and gamma_i = 1 - clamp((i - i_lo) / (i_hi - i_lo), 0, 1). Since r_i
             falls geometrically with i, the book's ramp (linear in r) and this one (linear in
             log r) agree at both ends and differ in between. ``attention_factor`` overrides the
             temperature 0.1 ln s + 1 (transformers' ``attention_factor``); DeepSeek's variant gives
             ``mscale`` and ``mscale_all_dim`` instead, and the temperature is then
             (0.1 mscale ln s + 1) / (0.1 mscale_all_dim ln s + 1) (1 when they are equal, as in
             DeepSeek-V3, whose attention applies the sharpening to the softmax scale instead).
    - "llama3": Llama 3.1's piecewise rule over the wavelength lambda_i = 2 pi / theta_i, with
             L the original context: lambda_i < L / high_freq_factor -> theta_i untouched;
             lambda_i > L / low_freq_factor -> theta_i / s; in between the blend
             (1 - m) theta_i / s + m theta_i, m = (L / lambda_i - low) / (high - low). No temperature.
    Returns (inv_freq (d_h/2,), temperature), the temperature being the factor on cos and sin.
    """
    if head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim must be even for RoPE (channels rotate in pairs); got {head_dim}")
    if scaling not in ROPE_SCALINGS:
        raise ValueError(f"rope scaling must be one of {ROPE_SCALINGS}; got {scaling!r}")
    if base <= 1:
        raise ValueError(f"rope base must be > 1; got {base}")
    if scaling is not None and factor < 1:
        raise ValueError(f"rope factor (the context extension s) must be >= 1; got {factor}")
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim  # 2i/d_h
    if scaling == "ntk":
        base = base * factor ** (head_dim / (head_dim - 2))
    inv_freq = base ** (-exponents)
    temperature = 1.0  # not ``mscale``: that argument is DeepSeek's numerator, read below
    if scaling == "pi":
        inv_freq = inv_freq / factor
    elif scaling == "yarn":
        turns = original_max_len * inv_freq / (2 * math.pi)  # r_i = L / lambda_i
        keep = ((turns - beta_slow) / (beta_fast - beta_slow)).clamp(0.0, 1.0)  # gamma(r): 1 keeps theta_i
        inv_freq = keep * inv_freq + (1 - keep) * inv_freq / factor
        temperature = yarn_temperature(factor)
    elif scaling == "yarn_hf":
        def index_of(turns: float) -> float:  # the channel index i at which r_i = turns
            return head_dim * math.log(original_max_len / (turns * 2 * math.pi)) / (2 * math.log(base))

        lo, hi = index_of(beta_fast), index_of(beta_slow)
        if truncate:
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, head_dim - 1)
        if lo == hi:
            hi += 0.001  # transformers' guard against a zero-width ramp
        ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0.0, 1.0)
        keep = 1 - ramp  # 1 keeps theta_i (low i: fast channels), 0 interpolates
        inv_freq = keep * inv_freq + (1 - keep) * inv_freq / factor
        if attention_factor is not None:
            temperature = attention_factor
        elif mscale and mscale_all_dim:
            temperature = yarn_temperature(factor, mscale) / yarn_temperature(factor, mscale_all_dim)
        else:
            temperature = yarn_temperature(factor)
    elif scaling == "llama3":
        if not 0 < low_freq_factor < high_freq_factor:
            raise ValueError(f"llama3 RoPE needs 0 < low_freq_factor < high_freq_factor; got {low_freq_factor}, {high_freq_factor}")
        wavelength = 2 * math.pi / inv_freq
        long_wave, short_wave = original_max_len / low_freq_factor, original_max_len / high_freq_factor
        mix = ((original_max_len / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)).clamp(0.0, 1.0)
        blended = (1 - mix) * inv_freq / factor + mix * inv_freq
        inv_freq = torch.where(wavelength < short_wave, inv_freq, torch.where(wavelength > long_wave, inv_freq / factor, blended))
    return inv_freq.to(torch.float32), temperature


def rope_turns(inv_freq: Tensor, length: int) -> Tensor:
    """r_i = L theta_i / (2 pi): how many full turns pair i makes over ``length`` = L positions.

    (d_h/2,) -> (d_h/2,). A pair with r_i < 1 never completes a turn inside the context, so the
    model only ever sees part of its circle; YaRN's ramp (``rope_inverse_frequencies``, "yarn") is
    written in these units: pairs with r_i > beta_fast are kept, pairs with r_i < beta_slow are
    interpolated (Peng et al. 2024, section 3.2)."""
    if inv_freq.dim() != 1:
        raise ValueError(f"inv_freq must be a 1-D tensor of pair frequencies (d_h/2,); got shape {tuple(inv_freq.shape)}")
    if length < 1:
        raise ValueError(f"length must be >= 1 (a context of L positions); got {length}")
    return length * inv_freq.to(torch.float64) / (2 * math.pi)


def ntk_base(base: float, factor: float, head_dim: int) -> float:
    """The NTK-aware base b' = b s^(d_h/(d_h - 2)) (bloc97 2023).

    Chosen so that the slowest pair, theta_{d_h/2-1} = b^(-(d_h-2)/d_h), becomes exactly s times
    slower, while pair 0 (theta_0 = 1 for every base) is unchanged; the pairs between are slowed
    by s^(2i/(d_h-2)), a geometric blend of "keep" and "interpolate"."""
    if head_dim < 4 or head_dim % 2:
        raise ValueError(f"head_dim must be even and >= 4 (the exponent divides by d_h - 2); got {head_dim}")
    if base <= 1:
        raise ValueError(f"base must be > 1; got {base}")
    if factor < 1:
        raise ValueError(f"factor (the context extension s) must be >= 1; got {factor}")
    return base * factor ** (head_dim / (head_dim - 2))


def yarn_temperature(factor: float, mscale: float = 1.0) -> float:
    """YaRN's factor on q and k, sqrt(1/t) = 0.1 ln s + 1 (Peng et al. 2024, eq. 22): the logits are
    multiplied by its square, which sharpens the softmax that the longer context flattens. 1 for s = 1.

    ``mscale`` = k gives DeepSeek's generalisation m(k) = 0.1 k ln s + 1 (its config's ``mscale`` and
    ``mscale_all_dim``; k = 1 is YaRN's). The one place this formula is written: the RoPE temperatures
    of "yarn" and "yarn_hf" and MLA's softmax factor m(mscale_all_dim)^2 all call it."""
    if factor < 1:
        raise ValueError(f"factor (the context extension s) must be >= 1; got {factor}")
    return 0.1 * mscale * math.log(factor) + 1.0


def rotate_half(x: Tensor) -> Tensor:
    """(x_1, x_2) -> (-x_2, x_1) on the two halves of the last dim: a 90-degree turn of every pair
    (x[i], x[i + d/2]). We pair channel i with i + d/2 (not 2i with 2i+1); either pairing gives
    RoPE, this one is what Llama-family checkpoints use."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """Applies R_m, the rotation by m * theta_i on each channel pair, to queries or keys at positions m.

    x' = x * cos(m theta) + rotate_half(x) * sin(m theta), times the YaRN temperature factor.
    """

    TABLE_LIMIT = 1 << 15  # positions up to this are looked up in a table of cos / sin; beyond, computed

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        scaling: str | None = None,
        factor: float = 1.0,
        original_max_len: int = 2048,
        *,
        inv_freq: Tensor | None = None,
        temperature: float = 1.0,
        **options,
    ):
        """``options``: the scheme's further parameters (beta_fast, beta_slow, low_freq_factor,
        high_freq_factor, truncate, attention_factor), see ``rope_inverse_frequencies``.

        ``inv_freq``: given float32 frequencies (d_h/2,) used as they are, with ``temperature``, in place
        of the computed ones: another library's float32 rounding of the same formula (transformers
        computes theta_i in float32, 1-2 ulps from ours), so that a converted model turns every
        position by the angles that library uses (``companion.hf.from_hf``)."""
        super().__init__()
        if inv_freq is None:
            inv_freq, mscale = rope_inverse_frequencies(head_dim, base, scaling, factor, original_max_len, **options)
        else:
            if head_dim < 2 or head_dim % 2 or inv_freq.dtype != torch.float32 or tuple(inv_freq.shape) != (head_dim // 2,):
                raise ValueError(f"inv_freq must be a float32 tensor of shape ({head_dim // 2},) (one theta_i per "
                                 f"channel pair); got {inv_freq.dtype} {tuple(inv_freq.shape)}")
            if not bool(torch.isfinite(inv_freq).all() and (inv_freq > 0).all()):
                raise ValueError("inv_freq must hold finite frequencies > 0")
            inv_freq, mscale = inv_freq.detach().clone(), float(temperature)
        self.head_dim, self.base, self.scaling, self.factor, self.mscale = head_dim, base, scaling, factor, mscale
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        # Not state, only speed (decoding asks for a few rows per layer and step): a table of cos / sin
        # (and of sin with its first half negated, see ``rotate_fast``) for positions 0..n-1, rebuilt
        # when inv_freq changes (its version, dtype or device); and the last lookup, which the layers
        # of one forward that share this module reuse (same positions tensor, unchanged since).
        self._table: tuple[tuple, Tensor, Tensor, Tensor] | None = None
        self._last: tuple | None = None

    def _apply(self, fn, recurse: bool = True):
        """``model.to(torch.bfloat16)`` (or ``.half()``) converts every floating buffer; the frequencies
        stay float32 (as transformers keeps them): theta_i rounded to bf16's 8 bits would turn position
        m by m * theta_i * 2^-9 too much or too little, an error that grows with m (0.24 against 0.15
        on the logits at 120 tokens). Device moves and float64 apply as usual."""
        before = self.inv_freq
        super()._apply(fn, recurse)
        after = self.inv_freq
        if after.is_floating_point() and torch.finfo(after.dtype).bits < 32 <= torch.finfo(before.dtype).bits:
            self.inv_freq = before.to(device=after.device, dtype=torch.float32)  # the values before the cast
        return self

    def _angles(self, positions: Tensor) -> Tensor:
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]  # (T, d_h/2)
        return torch.cat((angles, angles), dim=-1)  # channel i and i + d/2 share theta_i

    def _table_key(self) -> tuple:
        version = None if self.inv_freq.is_inference() else self.inv_freq._version  # inference tensors have none
        # data_ptr: a tensor assigned in place of the buffer (``_apply``, a test's edit) starts at version 0 again
        return (version, self.inv_freq.dtype, self.inv_freq.device, self.inv_freq.data_ptr())

    def lookup(self, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(T,) -> cos, sin, and sin with its first half negated, each (T, d_h), the temperature
        factor included (``cos_sin`` returns the first two; ``rotate_fast`` uses the first and third).

        Every layer calls this, so it reads position values on the host only when they live on the
        CPU (free there); on a GPU that read would be a device sync per layer, and the model's forward
        checks the positions once instead (``Decoder.forward``). Called again with the same positions
        tensor (the next layer of the same forward, when the layers share this module), it returns the
        same three tensors without a lookup or a check."""
        _check_positions(positions, values=False)
        if compiling():  # traced: the formula itself (the table and the memo are host-side bookkeeping)
            return self._from_angles(self._angles(positions))
        last = self._last
        if last is not None and positions is last[0] and not positions.is_inference() \
                and last[1] == positions._version and last[2] == self._table_key():
            return last[3]
        on_cpu = positions.device.type == "cpu"
        # The table needs max(positions) on the host: free on a CPU, a device sync on a GPU (where the
        # direct formula is one fused-enough kernel anyway), so only CPU positions use it.
        n = 0
        if positions.numel() and on_cpu:
            lo, hi = value_range(positions)
            if lo < 0:
                raise ValueError("positions must be >= 0")
            n = hi + 1
        key = self._table_key()
        if not 0 < n <= self.TABLE_LIMIT:
            out = self._from_angles(self._angles(positions))
        else:
            if self._table is None or self._table[0] != key or self._table[1].shape[0] < n:
                size = min(self.TABLE_LIMIT, max(256, 1 << (n - 1).bit_length()))  # grow by doubling
                with torch.inference_mode(False):  # a plain tensor even when first asked under inference_mode
                    arange = torch.arange(size, device=self.inv_freq.device)
                    self._table = (key, *self._from_angles(self._angles(arange)))
            index = positions.to(self._table[1].device, torch.long)
            out = tuple(t.index_select(0, index) for t in self._table[1:])
        if not positions.is_inference():
            self._last = (positions, positions._version, key, out)
        return out

    def _from_angles(self, angles: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        cos, sin = angles.cos() * self.mscale, angles.sin() * self.mscale
        half = self.head_dim // 2
        return cos, sin, torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)

    def cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """(T,) -> cos, sin each (T, d_h), already multiplied by the temperature factor (see ``lookup``)."""
        cos, sin, _ = self.lookup(positions)
        return cos, sin

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:  # (..., T, d_h), (T,) -> (..., T, d_h)
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"RoPE was built for head_dim={self.head_dim}; got last dim {x.shape[-1]}")
        if x.shape[-2] != positions.shape[0]:
            raise ValueError(f"positions must have one entry per row: {positions.shape[0]} vs T={x.shape[-2]}")
        return self.rotate(x, *self.cos_sin(positions.to(x.device)))

    def rotate(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """x (..., T, d_h) rotated with the rows of ``cos_sin`` (T, d_h): lets queries and keys at the
        same positions share one lookup."""
        if x.shape[-1] != self.head_dim or x.shape[-2] != cos.shape[0]:
            raise ValueError(f"x must be (..., T={cos.shape[0]}, head_dim={self.head_dim}); got {tuple(x.shape)}")
        return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)

    def rotate_fast(self, x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
        """``rotate`` in fewer operations, with the same result bit for bit: rotate_half(x) * sin is
        (-x_2 sin, x_1 sin), which is the halves of x swapped (a roll by d_h / 2) times sin with its
        first half negated (``lookup``'s third table): the negation moves from x to sin, exactly."""
        if x.shape[-1] != self.head_dim or x.shape[-2] != cos.shape[0]:
            raise ValueError(f"x must be (..., T={cos.shape[0]}, head_dim={self.head_dim}); got {tuple(x.shape)}")
        if cos.dtype != x.dtype:
            cos, signed_sin = cos.to(x.dtype), signed_sin.to(x.dtype)
        return x * cos + x.roll(self.head_dim // 2, dims=-1) * signed_sin

    def rotate_qk(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Queries and keys at the same ``positions`` rotated with one lookup: what an attention layer calls."""
        cos, _, signed_sin = self.lookup(positions)
        return self.rotate_fast(q, cos, signed_sin), self.rotate_fast(k, cos, signed_sin)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base:g}, scaling={self.scaling}, factor={self.factor:g}"


# ----------------------------------------------------------------------------- ALiBi


def alibi_slopes(n_heads: int) -> Tensor:
    """Per-head slopes m_h. For h a power of two: m_h = 2^(-8h'/h), h' = 1..h (a geometric sequence
    from 2^(-8/h) down to 2^-8). Otherwise: the slopes for the nearest lower power of two n, then
    every other slope of the sequence for 2n, as in the ALiBi paper's reference code."""
    if n_heads < 1:
        raise ValueError(f"n_heads must be >= 1; got {n_heads}")

    def powers(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    n = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = powers(n)
    if n < n_heads:
        slopes += powers(2 * n)[0::2][: n_heads - n]
    return torch.tensor(slopes)


def alibi_bias(slopes: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
    """Additive score bias -m_h |p_i - p_j|, shape (h, T, S), for query and key absolute positions."""
    distance = (q_positions[:, None] - k_positions[None, :]).abs().to(slopes.dtype)  # (T, S)
    return -slopes[:, None, None] * distance[None]
