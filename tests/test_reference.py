"""Reference checkpoints (companion.data.reference): every file is checked against the committed
SHA-256 table before it is read, and the committed chapter 3 translator is the chapter's model."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

from companion.data.reference import DIGEST_FILE, DIGESTS, ROOT, load_reference, verify

NAME = "ch03-translator"
MAX_BYTES = 5 * 1024 * 1024
ROOT_DIR = Path(__file__).resolve().parents[1]


def digests_of(folder: Path) -> dict[str, str]:
    # independent of the module: hashlib over the raw bytes
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.name != DIGEST_FILE}


@pytest.fixture
def small_folder(tmp_path):
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "a.json").write_text('{"x": 1}\n')
    (folder / "b.bin").write_bytes(bytes(range(256)))
    return folder


def test_verify_accepts_matching_files(small_folder):
    table = digests_of(small_folder)
    assert verify(small_folder, table) == table


def test_verify_names_a_changed_file(small_folder):
    table = digests_of(small_folder)
    data = bytearray((small_folder / "b.bin").read_bytes())
    data[10] ^= 1                                            # one flipped bit
    (small_folder / "b.bin").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"b\.bin has SHA-256"):
        verify(small_folder, table)


def test_verify_refuses_missing_and_unlisted_files(small_folder):
    table = digests_of(small_folder)
    (small_folder / "extra.txt").write_text("not in the table")
    with pytest.raises(ValueError, match=r"extra\.txt is not in the digest table"):
        verify(small_folder, table)
    (small_folder / "extra.txt").unlink()
    (small_folder / "a.json").unlink()
    with pytest.raises(ValueError, match=r"a\.json is missing"):
        verify(small_folder, table)


def test_verify_refuses_an_empty_table(small_folder):
    with pytest.raises(ValueError, match="no digests"):
        verify(small_folder, {})


def test_unknown_reference_name_is_refused():
    with pytest.raises(ValueError, match="name must be one of"):
        load_reference("no-such-model")


# ----------------------------------------------------------------------------- the committed reference


def test_committed_digests_match_the_files_and_the_table_beside_them():
    folder = ROOT / NAME
    assert DIGESTS[NAME] == digests_of(folder)
    assert json.loads((folder / DIGEST_FILE).read_text()) == DIGESTS[NAME]


def test_committed_files_are_at_most_5_MB():
    sizes = {p.name: p.stat().st_size for p in (ROOT / NAME).iterdir()}
    assert all(size <= MAX_BYTES for size in sizes.values()), sizes
    assert sum(sizes.values()) <= MAX_BYTES, sizes


def test_a_tampered_copy_of_the_reference_raises_naming_the_file(tmp_path):
    shutil.copytree(ROOT / NAME, tmp_path / NAME)
    weights = tmp_path / NAME / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x40                                         # a weight's last byte
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"model\.safetensors has SHA-256"):
        load_reference(NAME, root=tmp_path)


def _chapter_recipe():
    spec = importlib.util.spec_from_file_location("ch03_translation",
                                                  ROOT_DIR / "experiments" / "ch03_translation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)                          # defines functions only
    return module


def test_committed_reference_is_the_chapters_model_and_tokenizers():
    ref = load_reference(NAME)
    recipe = _chapter_recipe()
    data = recipe.chapter_data()
    assert ref.src_tok.to_dict() == data["src_tok"].to_dict()
    assert ref.tgt_tok.to_dict() == data["tgt_tok"].to_dict()
    assert ref.model.config == recipe.chapter_config(data["src_tok"], data["tgt_tok"])
    assert ref.info["steps"] == 1600 and ref.info["command"] == recipe.COMMAND
    # float32 parameters holding float16 values, as saved; the output layer is still tied
    for p in ref.model.parameters():
        assert p.dtype == torch.float32
        torch.testing.assert_close(p, p.half().float(), rtol=0, atol=0)
    assert ref.model.out.weight is ref.model.tgt_embed.weight
    assert not ref.model.training
