"""python -m companion generate / sample: bad input is refused with one line naming the argument, the
context rule is one for both commands, the prompt is echoed, and --help is quick and says each default once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from companion.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


def fails(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert message in err, err


def test_sample_refuses_a_nan_alpha(tmp_path, capsys):
    for alpha in ("nan", "inf", "-1"):
        fails(["sample", "--checkpoint", str(tmp_path), "--prompt", "x", "--alpha", alpha],
              f"error: --alpha must be in [0, 10] (the length-penalty exponent; 0: none; a larger one overflows "
              f"the beam's scores); got {float(alpha)}",
              capsys)


def test_generate_refuses_encoder_decoder_models(tmp_path, capsys):
    fails(["generate", "--preset", "base"], "error: --preset base is an encoder-decoder (translation) preset; "
          "generate continues a prompt with a decoder-only model", capsys)
    from companion.engine.engine import Engine
    from companion.inference.generate import generate
    from companion.models import from_preset
    from companion.training.checkpoint import save_checkpoint

    torch.manual_seed(0)
    model = from_preset("tiny", n_encoder_layers=1, n_decoder_layers=1, d_model=16, n_heads=2, d_ff=32,
                        src_vocab_size=20, tgt_vocab_size=20, max_len=16)
    run = tmp_path / "s2s"
    save_checkpoint(run, 1, model)
    fails(["generate", "--checkpoint", str(run), "--ids", "1 2"],
          f"error: generate --checkpoint {run} needs a decoder-only model (Decoder or GPT), which continues a "
          "prompt; got Seq2SeqTransformer, an encoder-decoder that translates", capsys)
    for build in (lambda: Engine(model), lambda: generate(model, [1, 2])):
        with pytest.raises(ValueError, match="needs a decoder-only model"):
            build()


@pytest.mark.parametrize("temperature", ["1e-39", "1e-300", "5e-324"])
def test_tiny_temperatures_are_refused_before_sampling(temperature, capsys):
    fails(["generate", "--preset", "gpt2-tiny", "--temperature", temperature, "--max-new-tokens", "2"],
          f"error: temperature must be 0 (greedy) or >= 1e-06; got {float(temperature)!r}: dividing the logits by "
          "it overflows", capsys)
    from companion.inference.generate import SamplingParams, sample

    logits = torch.tensor([3.0e4, 1.0, -2.0e4])
    assert sample(logits, SamplingParams(temperature=1e-6), torch.Generator().manual_seed(0)) == 0


def test_generate_slides_past_the_context_and_says_why_it_stopped(capsys):
    # gpt2-tiny reads 64 tokens: 5 + 80 tokens go past it
    assert main(["generate", "--preset", "gpt2-tiny", "--prompt", "ROMEO", "--max-new-tokens", "80", "--seed", "0"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("ROMEO")  # the prompt, echoed
    assert "generate: 80 tokens generated after the 5-token prompt (--max-new-tokens 80); the prompt is echoed first" \
        in err
    long = "x" * 70  # longer than the context: cropped, as sample does, not refused
    assert main(["generate", "--preset", "gpt2-tiny", "--prompt", long, "--max-new-tokens", "3", "--seed", "0"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(long)
    assert "note: the prompt has 70 tokens, more than the model's context of 64; the model sees only its last 64 " \
           "tokens" in err


def test_generate_ids_with_a_stop_token_reports_it(capsys):
    from companion.inference.generate import generate
    from companion.models import from_preset

    torch.manual_seed(0)
    first = generate(from_preset("gpt2-tiny").eval(), [1, 2, 3], max_new_tokens=1).tokens[0][0]
    assert main(["generate", "--preset", "gpt2-tiny", "--ids", "1 2 3", "--stop", str(first), "--seed", "0"]) == 0
    out, err = capsys.readouterr()
    assert out.split() == [str(first)]  # --ids: only the generated ids
    assert f"(stop token {first}); the prompt is not echoed (--ids)" in err


def help_texts(monkeypatch) -> dict[str, str]:
    """Every command's --help, formatted in this process on one wide line per option."""
    from test_cli import subparsers

    monkeypatch.setenv("COLUMNS", "10000")
    return {name: parser.format_help() for name, parser in subparsers().items() if name != "course"}


def test_sample_and_generate_help_state_the_same_context_rule(monkeypatch):
    from companion.training.cli import CONTEXT_RULE

    texts = help_texts(monkeypatch)
    for command in ("generate", "sample"):
        assert CONTEXT_RULE in " ".join(texts[command].split()), command


def test_help_shows_each_default_once(monkeypatch):
    for command, text in help_texts(monkeypatch).items():
        for line in text.splitlines():
            assert line.count("default") <= 1, f"{command}: {line}"
            assert "(default: None)" not in line and "(default: False)" not in line, f"{command}: {line}"


def test_top_level_help_loads_no_torch():
    probe = ("import sys\nfrom companion.__main__ import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             "print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert r.stdout.strip().endswith("False"), r.stdout + r.stderr


def test_a_translation_cut_by_the_model_max_len_says_so(tmp_path, monkeypatch, capsys):
    from companion.models import from_preset
    from companion.training import checkpoint

    torch.manual_seed(0)
    model = from_preset("tiny", n_encoder_layers=1, n_decoder_layers=1, d_model=16, n_heads=2, d_ff=32,
                        src_vocab_size=20, tgt_vocab_size=20, max_len=6).eval()
    run = tmp_path / "s2s"
    checkpoint.save_checkpoint(run, 1, model)
    real = model.out.forward

    def never_ends(x):  # this model never emits the end token (2, without a tokenizer)
        logits = real(x)
        logits[..., 2] = float("-inf")
        return logits

    monkeypatch.setattr(model.out, "forward", never_ends)
    monkeypatch.setattr(checkpoint, "load_model", lambda *args, **kwargs: model)
    assert main(["translate", "--checkpoint", str(run), "--prompt", "3 4 5", "--beam-size", "1",
                 "--max-new-tokens", "50"]) == 0
    out, err = capsys.readouterr()
    assert len(out.split()) == 6
    assert err == ("note: the translation stopped at 6 tokens without an end token: that is the model's max_len "
                   "(6), fewer than --max-new-tokens 50\n")
