import pytest
import torch

import companion
from companion.notebook.profile import ENV_VAR, profile


def test_default_profile_is_quick_on_cpu(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    p = profile()
    assert p.name == "quick" and p.device.type == "cpu"
    assert p.pick(quick=1, gpu=2) == 1


def test_profile_seeds_generators():
    profile("quick", seed=5)
    a = torch.rand(3)
    profile("quick", seed=5)
    assert torch.equal(a, torch.rand(3))


def test_environment_switch(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "GPU")
    if torch.cuda.is_available():
        p = profile()
    else:
        with pytest.warns(UserWarning, match="CUDA is absent"):
            p = profile()
    assert p.is_gpu and p.pick(quick=1, gpu=2) == 2


def test_unknown_profile_is_rejected(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "fast")
    with pytest.raises(ValueError, match="profile must be one of"):
        profile()
    with pytest.raises(ValueError, match="seed"):
        companion.seed_everything(-1)
