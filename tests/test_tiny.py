"""The locally built checkpoint: deterministic, identified by its digest, loadable offline."""

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from race_core.tiny import TINY, TinyConfig, build_checkpoint, checkpoint_digest


def test_same_seed_same_digest_other_seed_other_digest(tmp_path):
    a = checkpoint_digest(build_checkpoint(tmp_path / "a", TINY))
    b = checkpoint_digest(build_checkpoint(tmp_path / "b", TINY))
    c = checkpoint_digest(build_checkpoint(tmp_path / "c", TinyConfig(seed=1)))
    assert a == b != c


def test_loads_with_from_pretrained_local_files_only(tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, local_files_only=True)
    assert tokenizer.is_fast
    assert tokenizer.convert_tokens_to_ids("<think>") != tokenizer.unk_token_id
    assert len(tokenizer("<think></think>", add_special_tokens=False)["input_ids"]) == 2
    text = "Compute 12 * (3 + 4). calc[12 * 7] ünïcode"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
    logits = model(torch.tensor([tokenizer("Compute")["input_ids"]])).logits
    assert logits.shape[-1] == len(tokenizer)
