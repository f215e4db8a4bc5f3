"""Token-in/token-out rendering (docs/architecture.md §3): on generated trajectories, the rendered ids are the
tokenizer's own ids of the rendered text, an action's tokens are exactly the tokens that overlap
its characters, and the ids before every turn do not depend on that turn."""

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from race_core.render import CANONICAL, Renderer
from race_core.schema import Turn

EDGE = st.sampled_from(["", " ", "  ", "\n", " \n", "\t"])
WORDS = st.text(alphabet=st.sampled_from(list("abcxyz ABC.,:;()[]+-*/=?!'\"_") + ["é", "ü", "—", "✓", "中", "🙂"]),
                max_size=24)
NUMBERS = st.integers(min_value=0, max_value=10**30).map(str)


@st.composite
def field_text(draw, allow_empty=True):
    body = draw(st.one_of(WORDS, NUMBERS, st.builds(lambda a, n, b: f"{a}{n}{b}", WORDS, NUMBERS, WORDS)))
    text = draw(EDGE) + body + draw(EDGE)
    if not allow_empty and not text:
        text = "x"
    return text


@st.composite
def episodes(draw):
    question = draw(field_text(allow_empty=False))
    turns = [Turn(reasoning=draw(st.one_of(st.just(""), field_text())), action=draw(field_text(allow_empty=False)),
                  observation=draw(field_text())) for _ in range(draw(st.integers(1, 4)))]
    return question, turns


def byte_level_alphabet():
    """GPT-2's byte -> printable character map of byte-level BPE."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def char_ranges(tokenizer, ids, text):
    """Each token's [start, end) in `text`, from its bytes (byte-level BPE; added tokens are their
    own text): independent of the renderer's offsets. A token holding part of a character overlaps
    that character."""
    byte_of = {c: b for b, c in byte_level_alphabet().items()}
    added = {i for i in tokenizer.added_tokens_decoder}
    encoded = text.encode("utf-8")
    ranges, position = [], 0
    for token_id, token in zip(ids, tokenizer.convert_ids_to_tokens(ids), strict=True):
        size = len(token.encode("utf-8")) if token_id in added else len(bytes(byte_of[c] for c in token))
        start = len(encoded[:position].decode("utf-8", "ignore"))
        position += size
        ranges.append((start, len(encoded[:position].decode("utf-8", "replace"))))
    assert position == len(encoded)
    return ranges


def check_canonical(renderer, question, turns):
    tok = renderer.tokenizer
    rendered = renderer.render_turns(question, turns)
    segments = renderer.segments(question, turns)
    text = "".join(s for s, _, _ in segments)
    ids = rendered.input_ids.tolist()
    bos = list(renderer.bos_ids)
    assert ids == bos + tok(text, add_special_tokens=False)["input_ids"]
    body = ids[len(bos):]
    assert tok.decode(body, skip_special_tokens=False) == text
    ranges = char_ranges(tok, body, text)
    starts = [0]
    for s, _, _ in segments:
        starts.append(starts[-1] + len(s))
    actions = [k for k, (_, _, role) in enumerate(segments) if role.name == "ACTION"]
    for t, k in enumerate(actions):
        a, b = starts[k], starts[k + 1]
        overlapping = [i + len(bos) for i, (s, e) in enumerate(ranges) if s < b and e > a]
        assert list(range(*rendered.action_spans[t])) == overlapping, (t, turns[t].action)
    # Each token's (turn, role) is its last character's segment's (an empty segment holds none).
    for i, (_, e) in enumerate(ranges):
        k = max(j for j, (s, _, _) in enumerate(segments) if s and starts[j] <= e - 1)
        assert (rendered.turns[len(bos) + i], rendered.roles[len(bos) + i]) == (segments[k][1], segments[k][2]), i
    for t in range(len(turns)):
        start = rendered.turn_starts[t]
        assert renderer.prompt_ids(question, turns[:t]) == ids[:start]
        cut = list(turns)
        cut[t] = Turn("", turns[t].action, turns[t].observation)
        assert renderer.render_turns(question, cut).input_ids[:start].tolist() == ids[:start]


def tokenizers(tiny_policy, smollm2_tokenizer):
    from race_core.tiny import DEMO, build_tokenizer

    _, tiny = tiny_policy
    plain = copy.deepcopy(tiny)
    plain.chat_template = None
    return {"tiny": tiny, "tiny-plain": plain, "demo": build_tokenizer(DEMO), "smollm2": smollm2_tokenizer}


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_checkpoint):
    from race_core.policy import load_tokenizer

    return load_tokenizer(smollm2_checkpoint)


@pytest.mark.parametrize("name", ["tiny", "tiny-plain", "demo", "smollm2"])
def test_rendered_ids_are_the_tokenizers_own(name, tiny_policy, smollm2_tokenizer):
    renderer = Renderer(tokenizers(tiny_policy, smollm2_tokenizer)[name])
    assert renderer.tokenization == CANONICAL, renderer.fallback_reason

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(episodes())
    def check(episode):
        check_canonical(renderer, *episode)

    check()


def test_a_tokenizer_whose_ids_break_at_turn_boundaries_falls_back_to_segments(tiny_policy):
    """A tokenizer that merges the newline before `<think>` with it (no added token in between):
    the prompt for a turn would end in a token the full rendering does not have. The check finds
    it, says why, and renders segment by segment (spans exact, prefixes stable)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(set("\n<>/abcdefghijklmnopqrstuvwxyzACOU:[]+0123456789 ?.,'-()=×—ïüéö✓\t"))
    vocab = {c: i for i, c in enumerate(alphabet)}
    vocab["\n<"] = len(vocab)
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE(vocab=vocab, merges=[("\n", "<")])))
    renderer = Renderer(tok)
    assert renderer.tokenization == "segments"
    assert "is not a prefix of the rendered ids" in renderer.fallback_reason
    turns = [Turn("add", "calc[1+2]", "3"), Turn("", "finish[3]", "")]
    rendered = renderer.render_turns("q?", turns)
    for t in range(2):
        assert renderer.prompt_ids("q?", turns[:t]) == rendered.input_ids[:rendered.turn_starts[t]].tolist()
    a, b = rendered.action_spans[0]
    assert tok.convert_ids_to_tokens(rendered.input_ids[a:b].tolist()) == list("calc[1+2]")
