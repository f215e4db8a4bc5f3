"""Chat rendering and tokenization (docs/architecture.md §3): token-in/token-out.

Each turn is one assistant message `<think>{reasoning}</think>\\nAction: {action}`; its observation
follows as a user message `Observation: {observation}`. Removed reasoning renders as the empty block
`<think></think>`, so closing early is a concrete token event.

`segments` is the one place that says how a trajectory renders: (text, turn, role) pieces in order.
Their concatenation is the rendered text, and its token ids are the tokenizer's own ids of that
text, the ids a model saw in training and produces at inference. The text is cut only right after
an added token (the tokenizer splits its input at added tokens before anything else, so nothing
merges across them: in practice the special tokens that close and open chat messages), each piece
is tokenized whole (and cached: messages recur across the cover's candidates), and each token gets
the (turn, role) of its last character from its character offsets, so a token that straddles two
roles takes the later one (` go` in `Action: go` is an action token). An action's tokens are the
tokens that overlap the action's characters.

Whether this holds is checked once per tokenizer, on probe trajectories (unicode, whitespace at the
edges, empty reasoning, numbers): the pieces' ids must equal the tokenizer's ids of the whole text,
and the ids before every turn must not change when that turn's reasoning is removed, or when the
history is rendered as a prompt for that turn (what KV-prefix reuse and sampling rely on). A
tokenizer that fails (or is not a fast tokenizer, so has no offsets) is rendered in the documented
fallback, `segments` mode: every segment tokenized on its own and the ids concatenated (spans exact
by construction, prefixes stable, but the ids are not always the tokenizer's own); the reason is
logged once.

The chat template, when the checkpoint has one, supplies only the role wrappers (found by rendering
a conversation of sentinel strings). Past reasoning is always rendered here, exactly as the
trajectory holds it, because some templates strip or rewrite earlier think blocks; which kind the
template is, is detected once (`template_mode`: `keeps-reasoning`, `strips-reasoning`, or `plain`
without a template) and recorded with the cover's decisions (`render_mode`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from functools import lru_cache

import numpy as np

from race_core.schema import ToolCall, Trajectory, Turn, canonical_json

OPEN_MARKER = "<think>"
CLOSE_MARKER = "</think>"
ACTION_PREFIX = "\nAction: "
OBSERVATION_PREFIX = "Observation: "
CANONICAL, SEGMENTS = "canonical", "segments"
CACHE_ENTRIES = 8192  # texts whose ids are kept: messages recur across a shard's candidates, not across shards

logger = logging.getLogger(__name__)
_REPORTED: set[str] = set()  # tokenizers whose fallback was already logged


class Role(IntEnum):
    """What a token is. `END` is the assistant turn's closing wrapper (the model learns to stop)."""

    CONTEXT = 0
    OPEN = 1
    REASONING = 2
    CLOSE = 3
    ACTION_PREFIX = 4
    ACTION = 5
    END = 6
    OBSERVATION = 7


# Roles the policy produces: SFT targets and RL policy tokens.
ASSISTANT_ROLES = (Role.OPEN, Role.REASONING, Role.CLOSE, Role.ACTION_PREFIX, Role.ACTION, Role.END)

Segment = tuple[str, int, Role]  # (text, turn, role)


@dataclass(frozen=True)
class ChatWrappers:
    """The text a chat format puts around messages. `head` opens the conversation and the first
    user message; `user_to_assistant` closes a user message and opens an assistant one;
    `assistant_end` closes an assistant message; `assistant_to_user` opens the next user message."""

    head: str
    user_to_assistant: str
    assistant_end: str
    assistant_to_user: str

    @classmethod
    def plain(cls, eos_token: str | None) -> ChatWrappers:
        """Fallback for tokenizers without a chat template."""
        return cls(head="User: ", user_to_assistant="\nAssistant: ", assistant_end=(eos_token or "") + "\n",
                   assistant_to_user="User: ")

    @classmethod
    def from_template(cls, tokenizer) -> ChatWrappers:
        """Derive the wrappers from the tokenizer's chat template with sentinel messages."""
        u1, a1, u2 = "\x00RACE_U1\x00", "\x00RACE_A1\x00", "\x00RACE_U2\x00"
        conv = [{"role": "user", "content": u1}, {"role": "assistant", "content": a1},
                {"role": "user", "content": u2}]
        text = tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        i1, ia, i2 = text.index(u1), text.index(a1), text.index(u2)
        head = text[:i1]
        user_to_assistant = text[i1 + len(u1):ia]
        between = text[ia + len(a1):i2]
        closing = tokenizer.apply_chat_template(conv[:2], tokenize=False, add_generation_prompt=False)
        assistant_end = closing[closing.index(a1) + len(a1):]
        if not between.startswith(assistant_end):
            # Template closes assistant turns differently mid-conversation: keep all as context.
            assistant_end = ""
        return cls(head=_without_bos(tokenizer, head), user_to_assistant=user_to_assistant, assistant_end=assistant_end,
                   assistant_to_user=between[len(assistant_end):])

# -- tool calls (docs/architecture.md §3) ---------------------------------------------------------------------
_U1, _A1, _T1, _A2 = "\x00RACE_U1\x00", "\x00RACE_A1\x00", "\x00RACE_T1\x00", "\x00RACE_A2\x00"
_SENTINEL_CALL = ToolCall("race_sentinel_tool", {"race_arg": "RACE_ARG_7f3a"})
_SENTINEL_TOOL = {"type": "function", "function": {
    "name": "race_sentinel_tool", "description": "sentinel",
    "parameters": {"type": "object", "properties": {"race_arg": {"type": "string"}}}}}
TOOLS_TEMPLATE, TOOLS_JSON = "template", "json"


def call_messages(calls: Sequence[ToolCall]) -> list[dict]:
    """The `tool_calls` of an assistant message as chat templates take them (transformers'
    convention: arguments as an object). Ids are synthetic and fixed: the source's are never rendered."""
    return [{"type": "function", "id": f"call{k:05d}", "function": {"name": c.name, "arguments": c.arguments}}
            for k, c in enumerate(calls)]


def _common_suffix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[len(a) - 1 - n] == b[len(b) - 1 - n]:
        n += 1
    return n


@dataclass(frozen=True)
class ToolWrappers:
    """How a chat template renders tool calls: after an assistant message's content the calls'
    text (`call_text`), then `end` (closes the assistant message), `to_tool` (opens the tool
    result), the result itself, then `tool_to_assistant` (closes it, opens the next assistant
    message). Found from sentinel conversations like `ChatWrappers`."""

    end: str
    to_tool: str
    tool_to_assistant: str

    @staticmethod
    def call_text(tokenizer, calls: Sequence[ToolCall]) -> str:
        """The text the template writes for `calls` right after an assistant message's content:
        the difference between the message rendered with and without them."""
        without = tokenizer.apply_chat_template([{"role": "user", "content": _U1}, {"role": "assistant", "content": _A1}],
                                                tokenize=False)
        with_calls = tokenizer.apply_chat_template(
            [{"role": "user", "content": _U1},
             {"role": "assistant", "content": _A1, "tool_calls": call_messages(calls)}], tokenize=False)
        io, iw = without.index(_A1) + len(_A1), with_calls.index(_A1) + len(_A1)
        if with_calls[:iw] != without[:io]:
            raise ValueError("the template renders an assistant message differently before its content "
                             "when it has tool calls")
        return with_calls[iw:len(with_calls) - _common_suffix(with_calls[iw:], without[io:])]

    @classmethod
    def from_template(cls, tokenizer) -> ToolWrappers:
        """Raise ValueError (saying why) when the template cannot render tool calls after the content."""
        conv = [{"role": "user", "content": _U1},
                {"role": "assistant", "content": _A1, "tool_calls": call_messages([_SENTINEL_CALL])},
                {"role": "tool", "content": _T1, "tool_call_id": "call00000", "name": _SENTINEL_CALL.name},
                {"role": "assistant", "content": _A2}]
        try:
            text = tokenizer.apply_chat_template(conv, tools=[_SENTINEL_TOOL], tokenize=False)
            call = cls.call_text(tokenizer, [_SENTINEL_CALL])
            closing = tokenizer.apply_chat_template(conv[:2], tokenize=False)
        except ValueError:
            raise
        except Exception as exc:  # noqa: BLE001 - a template that raises on tools is one without tool support
            raise ValueError(f"the chat template fails on a tool-call conversation ({type(exc).__name__}: {exc})"
                             ) from None
        if _SENTINEL_CALL.name not in call or "RACE_ARG_7f3a" not in call:
            raise ValueError("the chat template does not render tool calls")
        if any(s not in text for s in (_U1, _A1, _T1, _A2)):
            raise ValueError("the chat template drops content from a tool-call conversation")
        ia, it, ia2 = text.index(_A1) + len(_A1), text.index(_T1), text.index(_A2)
        if not text.startswith(call, ia) or ia + len(call) > it:
            raise ValueError("the chat template does not render tool calls right after the message's content")
        after = text[ia + len(call):it]
        end = closing[closing.index(_A1) + len(_A1) + len(call):]
        if not after.startswith(end):
            end = ""  # closes a tool-call message differently mid-conversation: all of it context
        return cls(end=end, to_tool=after[len(end):], tool_to_assistant=text[it + len(_T1):ia2])


def tools_as_text(system: str, tools: Sequence[dict]) -> str:
    """The system text of the JSON fallback (a template without tool support): the system prompt,
    then the tools' schemas, one JSON object per line."""
    lines = [json.dumps(tool, ensure_ascii=False) for tool in tools]
    parts = [system] if system else []
    if lines:
        parts.append("Tools:\n" + "\n".join(lines))
    return "\n\n".join(parts)


def template_mode(tokenizer) -> str:
    """`keeps-reasoning` if the chat template renders an earlier assistant message's think block as
    given, `strips-reasoning` if it drops or rewrites it (Qwen3-style), `plain` without a template."""
    if not getattr(tokenizer, "chat_template", None):
        return "plain"
    reasoning = "RACE sentinel reasoning 7f3a"
    conv = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": f"{OPEN_MARKER}{reasoning}{CLOSE_MARKER}{ACTION_PREFIX}a"},
            {"role": "user", "content": "o"}, {"role": "assistant", "content": "b"}]
    text = tokenizer.apply_chat_template(conv, tokenize=False)
    return "keeps-reasoning" if f"{OPEN_MARKER}{reasoning}{CLOSE_MARKER}" in text else "strips-reasoning"


def _without_bos(tokenizer, head: str) -> str:
    """`head` without the BOS text the template writes: the tokenizer's own BOS id is prepended once."""
    bos = getattr(tokenizer, "bos_token", None)
    if bos and head.startswith(bos) and _adds_bos(tokenizer):
        return head[len(bos):]
    return head


def _adds_bos(tokenizer) -> bool:
    bos_id = getattr(tokenizer, "bos_token_id", None)
    if bos_id is None:
        return False
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return len(ids) > 0 and ids[0] == bos_id


@dataclass(frozen=True)
class Rendered:
    """Token ids of a trajectory with a (turn, role) tag per token.

    `turn_starts[t]` is the index of turn t's first open-marker token: everything before it is
    independent of turns >= t. `action_spans[t]` is the [start, end) range of turn t's action tokens.
    Context before turn 0 carries turn -1.
    """

    input_ids: np.ndarray  # int64 [L]
    turns: np.ndarray  # int32 [L]
    roles: np.ndarray  # int8 [L]
    turn_starts: tuple[int, ...]
    action_spans: tuple[tuple[int, int], ...]

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def mask(self, *roles: Role, turn: int | None = None) -> np.ndarray:
        m = np.isin(self.roles, [int(r) for r in roles])
        if turn is not None:
            m &= self.turns == turn
        return m

    def reasoning_token_count(self, turn: int | None = None) -> int:
        return int(self.mask(Role.REASONING, turn=turn).sum())


@dataclass(frozen=True)
class Tokens:
    """Ids of rendered segments: per token its (turn, role), and the [start, end) token range of
    every segment (the tokens that overlap its characters)."""

    ids: np.ndarray
    turns: np.ndarray
    roles: np.ndarray
    spans: list[tuple[int, int]]


PROBE_QUESTION = " Compute (12 + 7) × 3 — naïve ünïcödé  \n"
PROBE_TURNS = (
    Turn(reasoning=" First, add 12 and 7.\n", action="calc[12+7]", observation="19"),
    Turn(reasoning="", action=" calc[19*3] ", observation=" 57 \n"),
    Turn(reasoning="Done:\t57 ✓ ", action="finish[57]", observation=""),
)

PROBE_SYSTEM = "You answer with tools. Ünïcode ✓"
PROBE_TOOLS = ({"type": "function", "function": {"name": "search", "description": "Search the wiki.",
                "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                               "required": ["query"]}}},)
PROBE_TOOL_TURNS = (
    Turn(reasoning=" Look it up.\n", action=(ToolCall("search", {"query": "naïve 12 + 7"}),), observation="19"),
    Turn(reasoning="", action=(ToolCall("search", {"query": "a"}), ToolCall("search", {"query": "b", "n": 2})),
         observation=" first \n\nsecond"),
    Turn(reasoning="Done:\t57 ✓ ", action="finish[57]", observation=""),
)


class Renderer:
    """Renders trajectories to token ids for one tokenizer (chat template or plain fallback)."""

    def __init__(self, tokenizer, use_chat_template: bool | None = None, tokenization: str | None = None):
        self.tokenizer = tokenizer
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if use_chat_template is None:
            use_chat_template = has_template
        if use_chat_template and not has_template:
            raise ValueError("use_chat_template=True but the tokenizer has no chat template")
        self.use_chat_template = use_chat_template
        self.wrappers = (ChatWrappers.from_template(tokenizer) if use_chat_template
                         else ChatWrappers.plain(getattr(tokenizer, "eos_token", None)))
        self._tool_wrappers: ToolWrappers | None = None
        self._tool_mode: str | None = None
        self.tool_fallback_reason: str | None = None
        self._heads: dict[str, str] = {}
        self._calls: dict[str, str] = {}
        self.template_mode = template_mode(tokenizer) if use_chat_template else "plain"
        self.bos_ids: tuple[int, ...] = (tokenizer.bos_token_id,) if _adds_bos(tokenizer) else ()
        self._encode = lru_cache(maxsize=CACHE_ENTRIES)(self._encode_uncached)
        self._piece = lru_cache(maxsize=CACHE_ENTRIES)(self._piece_uncached)
        self._backend = _offsets_backend(tokenizer)
        self._cut = _added_token_pattern(tokenizer)
        if tokenization not in (None, CANONICAL, SEGMENTS):
            raise ValueError(f"tokenization must be {CANONICAL!r} or {SEGMENTS!r}, got {tokenization!r}")
        self.tokenization = CANONICAL
        self.fallback_reason = None if tokenization else self._canonical_problem()
        if tokenization == SEGMENTS or self.fallback_reason:
            self.tokenization = SEGMENTS
        if self.fallback_reason:
            name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
            if name not in _REPORTED:
                _REPORTED.add(name)
                logger.warning("tokenizer %s: rendering in segments mode (each segment tokenized alone): %s",
                               name, self.fallback_reason)

    @property
    def render_mode(self) -> str:
        """How this renderer tokenizes and what the template does with reasoning (for the record)."""
        return f"{self.tokenization}/{self.template_mode}"

    def render_mode_of(self, trajectory: Trajectory) -> str:
        """`render_mode`, plus how tool calls were rendered when the trajectory has any:
        `+tools:template` (the template's own tool-call format) or `+tools:json` (the JSON text fallback)."""
        has_calls = any(turn.tool_calls for turn in trajectory.turns)
        return f"{self.render_mode}+tools:{self.tool_mode}" if has_calls else self.render_mode

    # -- tool calls -----------------------------------------------------------------------------
    @property
    def tool_mode(self) -> str:
        """`template` when the chat template renders tool calls and passes the check below, else
        `json` (each call rendered as the text action `{"name": ..., "arguments": ...}`, the tools'
        schemas as text in the system message); the reason is logged once. Decided on first use.

        The check: a probe conversation (system, tools, a call, parallel calls, a text action) renders
        through the pieces to exactly the template's own text (for templates that keep past reasoning;
        those that strip it are rendered with the reasoning kept, by design)."""
        if self._tool_mode is None:
            self._tool_mode, self.tool_fallback_reason = TOOLS_JSON, "no chat template"
            if self.use_chat_template:
                try:
                    self._tool_wrappers = ToolWrappers.from_template(self.tokenizer)
                    self._tool_mode = TOOLS_TEMPLATE
                    self.tool_fallback_reason = self._tool_problem()
                except ValueError as exc:
                    self.tool_fallback_reason = str(exc)
                if self.tool_fallback_reason:
                    self._tool_mode, self._tool_wrappers = TOOLS_JSON, None
                    self._heads.clear()
            if self.tool_fallback_reason:
                name = getattr(self.tokenizer, "name_or_path", "") or type(self.tokenizer).__name__
                logger.warning("tokenizer %s: tool calls rendered as JSON text actions: %s", name,
                               self.tool_fallback_reason)
        return self._tool_mode

    def _tool_problem(self) -> str | None:
        if self.template_mode != "keeps-reasoning":
            return None
        probe = Trajectory(PROBE_QUESTION, "probe", "probe", PROBE_TOOL_TURNS, system=PROBE_SYSTEM, tools=PROBE_TOOLS)
        ours = "".join(text for text, _, _ in self.segments(probe.question, probe.turns, system=probe.system,
                                                             tools=probe.tools))
        theirs = _without_bos(self.tokenizer, self.tokenizer.apply_chat_template(
            self.chat_messages(probe), tools=list(probe.tools), tokenize=False))
        if ours != theirs:
            return "its rendering of a tool-call conversation differs from the pieces found with sentinels"
        return None

    def call_text(self, calls: Sequence[ToolCall]) -> str:
        """The template's text of a turn's tool calls (cached: calls recur across candidates)."""
        key = canonical_json([[c.name, c.arguments] for c in calls]) + json.dumps([list(c.arguments) for c in calls])
        if key not in self._calls:
            if len(self._calls) >= CACHE_ENTRIES:
                self._calls.pop(next(iter(self._calls)))  # the oldest: memory stays flat in dataset size
            self._calls[key] = ToolWrappers.call_text(self.tokenizer, calls)
        return self._calls[key]

    def head(self, system: str = "", tools: Sequence[dict] = ()) -> str:
        """The text before the question: the conversation's opening with the system prompt and the
        tools (the template's own rendering of them, or their JSON text in the system message)."""
        if not system and not tools:
            return self.wrappers.head
        key = json.dumps([system, list(tools)], ensure_ascii=False)
        if key not in self._heads:
            self._heads[key] = self._head_uncached(system, tools)
        return self._heads[key]

    def _head_uncached(self, system: str, tools: Sequence[dict]) -> str:
        native = bool(tools) and self.tool_mode == TOOLS_TEMPLATE
        text = system if native else tools_as_text(system, tools)
        if not self.use_chat_template:
            return f"System: {text}\n\n{self.wrappers.head}"
        conv = ([{"role": "system", "content": text}] if text else []) + [{"role": "user", "content": _U1}]
        try:
            rendered = self.tokenizer.apply_chat_template(conv, tools=list(tools) if native else None, tokenize=False)
        except Exception:  # noqa: BLE001 - a template without a system role: the text opens the user message
            return f"{self.wrappers.head}{text}\n\n"
        return _without_bos(self.tokenizer, rendered[:rendered.index(_U1)])

    def chat_messages(self, trajectory: Trajectory) -> list[dict]:
        """The trajectory as the chat messages the template would be given (what `segments`
        renders, for checks): reasoning as a think block opening each assistant message."""
        native = self.tool_mode == TOOLS_TEMPLATE
        system = trajectory.system if native else tools_as_text(trajectory.system, trajectory.tools)
        messages: list[dict] = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": trajectory.question})
        for t, turn in enumerate(trajectory.turns):
            calls = turn.tool_calls if native else ()
            content = f"{OPEN_MARKER}{turn.reasoning}{CLOSE_MARKER}"
            if calls:
                messages.append({"role": "assistant", "content": content, "tool_calls": call_messages(calls)})
            else:
                messages.append({"role": "assistant", "content": content + ACTION_PREFIX + turn.action_text})
            if t + 1 < len(trajectory.turns) or turn.observation:
                messages.append({"role": "tool", "content": turn.observation, "tool_call_id": "call00000",
                                 "name": calls[0].name} if calls else
                                {"role": "user", "content": OBSERVATION_PREFIX + turn.observation})
        return messages

    def forget(self) -> None:
        """Drop the cached ids of texts and calls (a shard's): what recurs is the next shard's own."""
        self._encode.cache_clear()
        self._piece.cache_clear()
        self._calls.clear()

    # -- tokenization ---------------------------------------------------------------------------
    def _encode_uncached(self, text: str) -> tuple[int, ...]:
        if not text:
            return ()
        return tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode(self, text: str) -> tuple[int, ...]:
        """The tokenizer's ids of `text` on its own (no special tokens added; cached)."""
        return self._encode(text)

    def _piece_uncached(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """The ids of `text` and each id's [start, end) characters (at least one character: a token
        the tokenizer maps to none is given the one after its start)."""
        encoding = self._backend.encode(text, add_special_tokens=False)
        ids = np.asarray(encoding.ids, dtype=np.int64)
        offsets = np.asarray(encoding.offsets, dtype=np.int64).reshape(len(ids), 2)
        offsets[:, 1] = np.maximum(offsets[:, 1], offsets[:, 0] + 1)
        ids.flags.writeable = offsets.flags.writeable = False  # cached: shared by every text holding the piece
        return ids, offsets

    def _pieces(self, text: str) -> Iterable[tuple[int, str]]:
        """(start, piece) cuts of `text` right after each added token."""
        start = 0
        if self._cut is not None:
            for match in self._cut.finditer(text):
                yield start, text[start:match.end()]
                start = match.end()
        if start < len(text):
            yield start, text[start:]

    def tokenize(self, segments: Sequence[Segment]) -> Tokens:
        """Ids of the concatenated segments with per-token tags (see the module docstring), computed
        over arrays: a cover renders every candidate, hundreds of thousands of tokens a shard."""
        if self.tokenization == SEGMENTS:
            return self._tokenize_segments(segments)
        lengths = np.fromiter((len(text) for text, _, _ in segments), dtype=np.int64, count=len(segments))
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        pieces = [(offset, *self._piece(piece)) for offset, piece in self._pieces("".join(t for t, _, _ in segments))]
        if pieces:
            ids = np.concatenate([piece_ids for _, piece_ids, _ in pieces])
            offsets = np.concatenate([piece_offsets + offset for offset, _, piece_offsets in pieces])
        else:
            ids, offsets = np.zeros(0, dtype=np.int64), np.zeros((0, 2), dtype=np.int64)
        first, last = offsets[:, 0], offsets[:, 1]  # each token's characters [first, last)
        # The token's tags are those of the segment holding its last character (an empty one owns none).
        index = np.arange(len(segments))
        owner = np.maximum.accumulate(np.where(lengths > 0, index, 0))
        tagged = owner[np.searchsorted(starts, last - 1, side="right") - 1]
        seg_turns = np.fromiter((turn for _, turn, _ in segments), dtype=np.int64, count=len(segments))
        seg_roles = np.fromiter((int(role) for _, _, role in segments), dtype=np.int64, count=len(segments))
        # A segment's span: the tokens that overlap its characters. Each token is checked against the
        # segments from the one holding its first character to its tag's (nearly always one or two).
        low = np.searchsorted(starts, first, side="right") - 1
        count = np.maximum(tagged - low + 1, 0)
        token = np.repeat(np.arange(len(ids)), count)
        segment = np.repeat(low, count) + (np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count))
        overlap = (lengths[segment] > 0) & (starts[segment] < last[token]) & (starts[segment] + lengths[segment] > first[token])
        token, segment = token[overlap], segment[overlap]
        span_start = np.full(len(segments), len(ids), dtype=np.int64)
        span_end = np.full(len(segments), -1, dtype=np.int64)
        np.minimum.at(span_start, segment, token)
        np.maximum.at(span_end, segment, token + 1)
        found = span_end >= 0
        # An empty span sits after the last token of the segments before it.
        after = np.concatenate([[0], np.maximum.accumulate(np.where(found, span_end, 0))[:-1]])[:len(segments)]
        spans = [(int(a), int(b)) if ok else (int(e), int(e))
                 for a, b, ok, e in zip(span_start, span_end, found, after, strict=True)]
        return Tokens(ids, seg_turns[tagged], seg_roles[tagged], spans)

    def _tokenize_segments(self, segments: Sequence[Segment]) -> Tokens:
        ids: list[int] = []
        turns: list[int] = []
        roles: list[int] = []
        spans: list[tuple[int, int]] = []
        for text, turn, role in segments:
            piece = self.encode(text)
            spans.append((len(ids), len(ids) + len(piece)))
            ids.extend(piece)
            turns.extend([turn] * len(piece))
            roles.extend([int(role)] * len(piece))
        return Tokens(np.asarray(ids, dtype=np.int64), np.asarray(turns, dtype=np.int64),
                      np.asarray(roles, dtype=np.int64), spans)

    # -- rendering ------------------------------------------------------------------------------
    def segments(self, question: str, turns: Sequence[Turn], open_next: bool = False, system: str = "",
                 tools: Sequence[dict] = ()) -> list[Segment]:
        """(text, turn, role) pieces in order: the one place that says how a trajectory renders.
        `open_next` ends with the opening of the next assistant message (a prompt for it).

        A tool-call turn, with a template that renders tool calls: the think block, then the
        template's text of the calls (its leading whitespace is the action prefix, the rest the
        action), the message's end, and the observation as the template's tool result. Otherwise
        (text actions, or the JSON fallback) `\\nAction: {action text}` and a user observation."""
        w = self.wrappers
        native = any(turn.tool_calls for turn in turns) and self.tool_mode == TOOLS_TEMPLATE
        out: list[Segment] = [(self.head(system, tools), -1, Role.CONTEXT), (question, -1, Role.CONTEXT),
                              (w.user_to_assistant, -1, Role.CONTEXT)]
        for t, turn in enumerate(turns):
            calls = turn.tool_calls if native else ()
            out += [(OPEN_MARKER, t, Role.OPEN), (turn.reasoning, t, Role.REASONING), (CLOSE_MARKER, t, Role.CLOSE)]
            if calls:
                text = self.call_text(calls)
                lead = len(text) - len(text.lstrip())
                out += [(text[:lead], t, Role.ACTION_PREFIX), (text[lead:], t, Role.ACTION),
                        (self._tool_wrappers.end, t, Role.END)]
            else:
                out += [(ACTION_PREFIX, t, Role.ACTION_PREFIX), (turn.action_text, t, Role.ACTION),
                        (w.assistant_end, t, Role.END)]
            last = t + 1 == len(turns)
            if not last or turn.observation or open_next:
                out += self.observation_segments(t, turn.observation, open_next=not last or open_next,
                                                 tool_result=bool(calls))
        return out

    def assistant_end(self, tool_calls: bool = False) -> str:
        """The text that closes an assistant message: of a turn with tool calls, the template's
        (when it renders them), else the chat format's."""
        if tool_calls and self.tool_mode == TOOLS_TEMPLATE:
            return self._tool_wrappers.end
        return self.wrappers.assistant_end

    def observation_segments(self, turn: int, observation: str, open_next: bool,
                             tool_result: bool = False) -> list[Segment]:
        """What follows turn `turn`'s assistant message: its observation as a user message (or,
        `tool_result`, as the template's tool message), then (`open_next`) the opening of the next
        assistant message."""
        if tool_result:
            tw = self._tool_wrappers
            out: list[Segment] = [(tw.to_tool, turn, Role.CONTEXT), (observation, turn, Role.OBSERVATION)]
            return out + [(tw.tool_to_assistant, turn, Role.CONTEXT)] if open_next else out
        w = self.wrappers
        out = [(w.assistant_to_user, turn, Role.CONTEXT), (OBSERVATION_PREFIX + observation, turn, Role.OBSERVATION)]
        if open_next:
            out.append((w.user_to_assistant, turn, Role.CONTEXT))
        return out

    def render(self, trajectory: Trajectory) -> Rendered:
        return self.render_turns(trajectory.question, trajectory.turns, system=trajectory.system,
                                 tools=trajectory.tools)

    def render_turns(self, question: str, turns: Sequence[Turn], system: str = "",
                     tools: Sequence[dict] = ()) -> Rendered:
        segments = self.segments(question, turns, system=system, tools=tools)
        tokens = self.tokenize(segments)
        bos = list(self.bos_ids)
        shift = len(bos)
        turn_starts = tuple(tokens.spans[k][0] + shift for k, (_, _, role) in enumerate(segments) if role == Role.OPEN)
        action_spans = tuple((a + shift, b + shift) for k, (a, b) in enumerate(tokens.spans)
                             if segments[k][2] == Role.ACTION)
        return Rendered(
            input_ids=np.concatenate([np.asarray(bos, dtype=np.int64), tokens.ids]),
            turns=np.concatenate([np.full(shift, -1), tokens.turns]).astype(np.int32),
            roles=np.concatenate([np.full(shift, int(Role.CONTEXT)), tokens.roles]).astype(np.int8),
            turn_starts=turn_starts,
            action_spans=action_spans,
        )

    def prompt_ids(self, question: str, turns: Sequence[Turn], system: str = "", tools: Sequence[dict] = ()
                   ) -> list[int]:
        """Ids of the context in which the policy writes the next turn: the history (each past
        turn with its observation), then the assistant opening, ending right before `<think>`."""
        segments = self.segments(question, turns, open_next=bool(turns), system=system, tools=tools)
        return list(self.bos_ids) + self.tokenize(segments).ids.tolist()

    @property
    def open_ids(self) -> tuple[int, ...]:
        return self.encode(OPEN_MARKER)

    @property
    def close_ids(self) -> tuple[int, ...]:
        return self.encode(CLOSE_MARKER)

    @property
    def end_ids(self) -> tuple[int, ...]:
        return self.encode(self.wrappers.assistant_end)

    # -- the once-per-tokenizer check -----------------------------------------------------------
    def _canonical_problem(self) -> str | None:
        """Why canonical rendering does not hold for this tokenizer, or None when it does."""
        if self._backend is None:
            return "not a fast tokenizer (no character offsets)"
        question, turns = PROBE_QUESTION, PROBE_TURNS
        full = self.render_turns(question, turns)
        text = "".join(text for text, _, _ in self.segments(question, turns))
        own = list(self.bos_ids) + list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if full.input_ids.tolist() != own:
            return "its ids of the rendered text differ from the ids of the text cut at added tokens"
        for t in range(len(turns)):
            start = full.turn_starts[t]
            if self.prompt_ids(question, turns[:t])[:start] != full.input_ids[:start].tolist() or \
                    len(self.prompt_ids(question, turns[:t])) != start:
                return f"the prompt for turn {t} is not a prefix of the rendered ids"
            cut = list(turns)
            cut[t] = Turn("", cut[t].action, cut[t].observation)
            removed = self.render_turns(question, cut)
            if removed.input_ids[:start].tolist() != full.input_ids[:start].tolist() or \
                    removed.turn_starts[t] != start:
                return f"removing turn {t}'s reasoning changes the ids before it"
        return None


def _offsets_backend(tokenizer):
    """The fast tokenizer's backend without its post-processor (which can trim offsets), or None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not getattr(tokenizer, "is_fast", False):
        return None
    from tokenizers import Tokenizer

    raw = Tokenizer.from_str(backend.to_str())
    raw.post_processor = None
    raw.no_truncation()
    raw.no_padding()
    return raw


def _added_token_pattern(tokenizer) -> re.Pattern | None:
    """The added tokens the tokenizer splits its input at (those that strip no whitespace)."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    contents = sorted({t.content for t in added.values() if t.content and not (t.lstrip or t.rstrip)},
                      key=len, reverse=True)
    return re.compile("|".join(re.escape(c) for c in contents)) if contents else None
