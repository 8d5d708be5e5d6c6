"""Chapter 4's reference character GPT (companion.data.reference.load_gpt_reference): its files are
checked against the committed SHA-256 table, it is the chapter's recipe, and it meets the chapter's bar."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

from companion.data.reference import DIGEST_FILE, DIGESTS, ROOT, load_gpt_reference
from companion.models.gpt import GPT

NAME = "ch04-char-gpt"
MAX_BYTES = 5 * 1024 * 1024
ROOT_DIR = Path(__file__).resolve().parents[1]


def digests_of(folder: Path) -> dict[str, str]:
    # independent of the module: hashlib over the raw bytes
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.name != DIGEST_FILE}


def _recipe():
    spec = importlib.util.spec_from_file_location("ch04_char_gpt",
                                                  ROOT_DIR / "experiments" / "ch04_char_gpt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)                          # defines functions only
    return module


def test_committed_digests_match_the_files_and_the_table_beside_them():
    folder = ROOT / NAME
    assert DIGESTS[NAME] == digests_of(folder)
    assert json.loads((folder / DIGEST_FILE).read_text()) == DIGESTS[NAME]


def test_committed_files_are_at_most_5_MB():
    sizes = {p.name: p.stat().st_size for p in (ROOT / NAME).iterdir()}
    assert sum(sizes.values()) <= MAX_BYTES, sizes


def test_a_tampered_copy_raises_naming_the_file(tmp_path):
    shutil.copytree(ROOT / NAME, tmp_path / NAME)
    weights = tmp_path / NAME / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x40                                         # a weight's last byte
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"model\.safetensors has SHA-256"):
        load_gpt_reference(NAME, root=tmp_path)


def test_unknown_name_and_foreign_config_are_refused(tmp_path):
    with pytest.raises(ValueError, match="name must be one of"):
        load_gpt_reference("no-such-reference")
    shutil.copytree(ROOT / NAME, tmp_path / NAME)
    config = tmp_path / NAME / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "d_model": 64}))
    table = digests_of(tmp_path / NAME)
    with pytest.raises(ValueError, match=r"unknown fields \['d_model'\]"):
        load_gpt_reference(NAME, root=tmp_path, digests=table)


def test_committed_reference_is_the_chapters_model_and_meets_its_bar():
    ref = load_gpt_reference(NAME)
    recipe = _recipe()
    data = recipe.chapter_data()
    assert ref.tok.to_dict() == data["tok"].to_dict()
    assert isinstance(ref.model, GPT)
    assert ref.model.config == recipe.chapter_config(data["tok"].vocab_size)
    assert ref.info["steps"] == 1600 and ref.info["command"] == recipe.COMMAND
    # float32 parameters holding float16 values, as saved; the output layer is still tied
    for p in ref.model.parameters():
        assert p.dtype == torch.float32
        torch.testing.assert_close(p, p.half().float(), rtol=0, atol=0)
    assert ref.model.lm_head.weight is ref.model.wte.weight
    assert not ref.model.training
    # the chapter's bar, on the whole validation split, recomputed here
    nats = recipe.held_out_nats(ref.model, data["val"])
    assert nats <= 1.70
    assert nats == pytest.approx(ref.info["val_nats_per_char"], abs=1e-3)
