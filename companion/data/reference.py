"""Reference checkpoints committed under ``data/reference/``, verified by SHA-256 before use.

A chapter whose budget cannot train the model it needs loads a reference instead. Each reference is
one folder ``data/reference/<name>/`` written by one documented command (the chapter and
``experiments/`` say which), holding

- ``config.json``: the model's config fields (``Seq2SeqConfig`` for ``ch03-translator``);
- ``model.safetensors``: the weights in float16 (small enough to commit; loading casts them to the
  model's float32 parameters);
- ``src_tokenizer.json`` / ``tgt_tokenizer.json``: the tokenizers' own ``save`` format;
- ``info.json``: how it was made (the command, the steps, the CPU time, the scores it reached);
- ``SHA256SUMS.json``: the digests of the five files above, as the command wrote them.

The digests that count are the ones in ``DIGESTS`` below, committed with this module: a digest file
lying beside the files could be edited together with them. ``load_reference(name)`` hashes every
file before reading any of it and refuses a folder with a missing, extra or changed file, naming it.

    ref = load_reference("ch03-translator")
    ref.model, ref.src_tok, ref.tgt_tok, ref.info

A decoder-only reference (``ch04-char-gpt``) holds one ``tokenizer.json`` instead of the two, and a
``GPTConfig`` in ``config.json``; ``load_gpt_reference(name)`` verifies and loads it the same way:

    ref = load_gpt_reference("ch04-char-gpt")
    ref.model, ref.tok, ref.info
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

from safetensors.torch import load_file
from torch import nn

from companion.files import sha256_file
from companion.models.gpt import GPT, GPTConfig
from companion.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from companion.tokenizers import tokenizer_from_json

__all__ = ["DIGESTS", "DIGEST_FILE", "ROOT", "Reference", "load_reference", "unique_state", "verify",
           "GPTReference", "load_gpt_reference"]

ROOT = Path(__file__).resolve().parents[2] / "data" / "reference"  # in a source checkout
DIGEST_FILE = "SHA256SUMS.json"

# name -> {file: SHA-256}. Regenerating a reference means updating its entry here (the command
# prints the new table); a mismatch is an error, never a warning.
DIGESTS: dict[str, dict[str, str]] = {
    "ch03-translator": {  # python experiments/ch03_translation.py --save data/reference/ch03-translator
        "config.json": "b9993fd82c8ea4a755cff52df11029c4907c15c0c73b12a25fa7a58ee71e5903",
        "info.json": "d384a32d31272ee29a49510d09d0f8719cf82e871551c3f9503bb6404226da40",
        "model.safetensors": "413fbc1c276ac06160c5cf30860ef46d37954d176c3601b91d75240fd703dd79",
        "src_tokenizer.json": "cb88c36722bc91c816347d28f4676dcf499fcf8fc613a70d25c46103d259c014",
        "tgt_tokenizer.json": "cdac8b46cb2f761092fa4b53795e03bcb755e7b4efe601c3348bff9478df45a0",
    },
    "ch04-char-gpt": {  # python experiments/ch04_char_gpt.py --save data/reference/ch04-char-gpt
        "config.json": "7b7037586a79979386e77c5466c16c9171aa914cc93e1c64198b6a2253d59bea",
        "info.json": "a01e506b403f68999caf3a0e86fce80e0cea362c14b1db7a016fa830c3fa86ae",
        "model.safetensors": "a2f13e7c66201bf4f65ac1d62b1a3350900a4a105890bae71da9869c6f56a334",
        "tokenizer.json": "0dee20d6644c1ade45173c2ee5b977ead0ad0807575d6d03a73eb2a1cc6d1986",
    },
}


@dataclass
class Reference:
    """A loaded reference: the model (float32, eval mode, CPU), its two tokenizers and ``info.json``."""

    name: str
    folder: Path
    model: nn.Module
    src_tok: object
    tgt_tok: object
    info: dict


def unique_state(model: nn.Module) -> dict:
    """``model.state_dict()`` without the later names of a tied tensor (safetensors stores each once)."""
    seen, out = set(), {}
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            out[name] = tensor
    return out


def verify(folder: Path | str, digests: dict[str, str]) -> dict[str, str]:
    """Check that ``folder`` holds exactly the files of ``digests`` (the digest file aside), each with its
    SHA-256. Returns ``digests``; raises ValueError naming the first missing, extra or changed file."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"reference folder {folder} does not exist (references live in the book's "
                         "repository under data/reference/: work in a clone, or retrain the model)")
    if not digests:
        raise ValueError(f"no digests recorded for {folder}: refusing to load unverified files")
    present = {p.name for p in folder.iterdir()} - {DIGEST_FILE}
    for name in sorted(set(digests) - present):
        raise ValueError(f"reference file {folder / name} is missing")
    for name in sorted(present - set(digests)):
        raise ValueError(f"reference file {folder / name} is not in the digest table: refusing it")
    for name, expected in sorted(digests.items()):
        actual = sha256_file(folder / name)
        if actual != expected:
            raise ValueError(
                f"reference file {folder / name} has SHA-256 {actual}, expected {expected}: "
                "the file is corrupted or was regenerated without updating "
                "companion.data.reference.DIGESTS"
            )
    return digests


def _verified_folder(name: str, root: Path | str | None, digests: dict[str, str] | None) -> Path:
    """``root/name`` (default ``ROOT``), verified against ``digests`` (default ``DIGESTS[name]``)."""
    if digests is None:
        if name not in DIGESTS:
            raise ValueError(f"name must be one of {sorted(DIGESTS)}; got {name!r}")
        digests = DIGESTS[name]
    folder = Path(ROOT if root is None else root) / name
    verify(folder, digests)
    return folder


def _load_model(folder: Path, config_cls: type, model_cls: type) -> nn.Module:
    """The model of ``config.json`` (fields of ``config_cls``) with the weights of ``model.safetensors``,
    float32 and in eval mode."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    known = {f.name for f in fields(config_cls)}
    if not set(config) <= known:
        raise ValueError(f"{folder / 'config.json'}: unknown fields {sorted(set(config) - known)}")
    model = model_cls(config_cls(**config))
    weights = load_file(folder / "model.safetensors")
    # a tied matrix (the output projection is an embedding) is stored under its first name only
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = set(model.state_dict()) - set(unique_state(model))
    if set(missing) - tied or unexpected:
        raise ValueError(f"{folder / 'model.safetensors'} does not fit config.json: "
                         f"missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}")
    return model.float().eval()


def load_reference(name: str, root: Path | str | None = None,
                   digests: dict[str, str] | None = None) -> Reference:
    """Verify, then load the translator reference ``root/name`` (default ``ROOT``) against ``digests``
    (default ``DIGESTS[name]``)."""
    folder = _verified_folder(name, root, digests)
    model = _load_model(folder, Seq2SeqConfig, Seq2SeqTransformer)
    src_tok = tokenizer_from_json(folder / "src_tokenizer.json")
    tgt_tok = tokenizer_from_json(folder / "tgt_tokenizer.json")
    info = json.loads((folder / "info.json").read_text(encoding="utf-8"))
    return Reference(name, folder, model, src_tok, tgt_tok, info)


@dataclass
class GPTReference:
    """A loaded decoder-only reference: the GPT (float32, eval mode, CPU), its tokenizer, ``info.json``."""

    name: str
    folder: Path
    model: nn.Module
    tok: object
    info: dict


def load_gpt_reference(name: str, root: Path | str | None = None,
                       digests: dict[str, str] | None = None) -> GPTReference:
    """Verify, then load the GPT reference ``root/name`` (config.json holds ``GPTConfig`` fields,
    tokenizer.json its one tokenizer); ``digests`` defaults to ``DIGESTS[name]``."""
    folder = _verified_folder(name, root, digests)
    model = _load_model(folder, GPTConfig, GPT)
    tok = tokenizer_from_json(folder / "tokenizer.json")
    info = json.loads((folder / "info.json").read_text(encoding="utf-8"))
    return GPTReference(name, folder, model, tok, info)
