"""The locally built checkpoint: deterministic, identified by its digest, loadable offline."""

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from race_core.policy import checkpoint_digest
from race_core.tiny import DEMO, TINY, TinyConfig, build_checkpoint, build_tokenizer


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


@pytest.fixture(scope="module")
def split_tokenizer():
    assert DEMO.split_digits and DEMO.corpus_episodes
    return build_tokenizer(DEMO)


def _pieces(tokenizer, text):
    return [tokenizer.decode([i]) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def test_split_digits_number_is_the_same_tokens_wherever_it_stands(split_tokenizer):
    # the byte-level default tokenizes "5928" differently after a space than after "(" or "["
    plain = build_tokenizer(replace(DEMO, split_digits=False))
    contexts = ["Observation: {}", "calc[{} - 25]", "Compute 3 * ({} + 1).", "so {} is"]

    def same_everywhere(tokenizer, number):
        alone = tokenizer(number, add_special_tokens=False)["input_ids"]
        return all(_contains(tokenizer(c.format(number), add_special_tokens=False)["input_ids"], alone)
                   for c in contexts)

    assert all(same_everywhere(split_tokenizer, n) for n in ("7", "42", "129", "5928", "13685"))
    assert not all(same_everywhere(plain, n) for n in ("42", "129", "5928"))


def _contains(ids, sub):
    return any(ids[i:i + len(sub)] == sub for i in range(len(ids) - len(sub) + 1))


def test_corpus_episodes_make_the_expert_phrases_short(split_tokenizer):
    generic = build_tokenizer(replace(DEMO, corpus_episodes=0, split_digits=False))
    text = "We still need 56 * (78 / 39 + 72). With 78 / 39 = 2, the next step is 2 + 72."
    assert len(_pieces(split_tokenizer, text)) < 0.6 * len(_pieces(generic, text))
    assert "".join(_pieces(split_tokenizer, text)) == text


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_split_digits_round_trips_any_text(split_tokenizer, text):
    ids = split_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert split_tokenizer.decode(ids) == text
