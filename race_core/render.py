"""Chat rendering and segment-wise tokenization (DESIGN §3).

Each turn is one assistant message `<think>{reasoning}</think>\\nAction: {action}`; its observation
follows as a user message `Observation: {observation}`. Removed reasoning renders as the empty block
`<think></think>`, so closing early is a concrete token event.

Every piece (segment) is tokenized on its own and the ids are concatenated, each token tagged with
(turn, role). Spans are therefore exact by construction, and the ids before turn t do not depend on
anything at or after t, which is what makes KV-prefix reuse in the scorer exact.

The chat template, when the checkpoint has one, supplies only the role wrappers (found by rendering
a conversation of sentinel strings); past reasoning is always rendered here, exactly as the
trajectory holds it, because some templates strip or rewrite earlier think blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from functools import lru_cache

import numpy as np

from race_core.schema import Trajectory, Turn

OPEN_MARKER = "<think>"
CLOSE_MARKER = "</think>"
ACTION_PREFIX = "\nAction: "
OBSERVATION_PREFIX = "Observation: "


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
        bos = getattr(tokenizer, "bos_token", None)
        if bos and head.startswith(bos) and _adds_bos(tokenizer):
            head = head[len(bos):]  # the tokenizer's own BOS is prepended once, below
        return cls(head=head, user_to_assistant=user_to_assistant, assistant_end=assistant_end,
                   assistant_to_user=between[len(assistant_end):])


def _adds_bos(tokenizer) -> bool:
    bos_id = getattr(tokenizer, "bos_token_id", None)
    if bos_id is None:
        return False
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return len(ids) > 0 and ids[0] == bos_id


@dataclass(frozen=True)
class Rendered:
    """Token ids of a trajectory with a (turn, role) tag per token.

    `turn_starts[t]` is the index of turn t's open marker: everything before it is independent of
    turns >= t. `action_spans[t]` is the [start, end) range of turn t's action tokens.
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


class Renderer:
    """Renders trajectories to token ids for one tokenizer (chat template or plain fallback)."""

    def __init__(self, tokenizer, use_chat_template: bool | None = None):
        self.tokenizer = tokenizer
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if use_chat_template is None:
            use_chat_template = has_template
        if use_chat_template and not has_template:
            raise ValueError("use_chat_template=True but the tokenizer has no chat template")
        self.wrappers = (ChatWrappers.from_template(tokenizer) if use_chat_template
                         else ChatWrappers.plain(getattr(tokenizer, "eos_token", None)))
        self.bos_ids: tuple[int, ...] = (tokenizer.bos_token_id,) if _adds_bos(tokenizer) else ()
        self._encode = lru_cache(maxsize=65536)(self._encode_uncached)

    def _encode_uncached(self, text: str) -> tuple[int, ...]:
        if not text:
            return ()
        return tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode(self, text: str) -> tuple[int, ...]:
        """Ids of one segment (cached: the same segments recur across candidates)."""
        return self._encode(text)

    def segments(self, question: str, turns: Sequence[Turn]):
        """(text, turn, role) pieces in order: the one place that says how a trajectory renders."""
        w = self.wrappers
        yield w.head, -1, Role.CONTEXT
        yield question, -1, Role.CONTEXT
        yield w.user_to_assistant, -1, Role.CONTEXT
        for t, turn in enumerate(turns):
            yield OPEN_MARKER, t, Role.OPEN
            yield turn.reasoning, t, Role.REASONING
            yield CLOSE_MARKER, t, Role.CLOSE
            yield ACTION_PREFIX, t, Role.ACTION_PREFIX
            yield turn.action, t, Role.ACTION
            yield w.assistant_end, t, Role.END
            if t + 1 < len(turns) or turn.observation:
                yield w.assistant_to_user, t, Role.CONTEXT
                yield OBSERVATION_PREFIX + turn.observation, t, Role.OBSERVATION
                if t + 1 < len(turns):
                    yield w.user_to_assistant, t, Role.CONTEXT

    def render(self, trajectory: Trajectory) -> Rendered:
        return self.render_turns(trajectory.question, trajectory.turns)

    def render_turns(self, question: str, turns: Sequence[Turn]) -> Rendered:
        ids: list[int] = list(self.bos_ids)
        turn_tags: list[int] = [-1] * len(ids)
        role_tags: list[int] = [int(Role.CONTEXT)] * len(ids)
        turn_starts: list[int] = []
        action_spans: list[tuple[int, int]] = []
        for text, t, role in self.segments(question, turns):
            if role == Role.OPEN:
                turn_starts.append(len(ids))
            piece = self.encode(text)
            if role == Role.ACTION:
                action_spans.append((len(ids), len(ids) + len(piece)))
            ids.extend(piece)
            turn_tags.extend([t] * len(piece))
            role_tags.extend([int(role)] * len(piece))
        return Rendered(
            input_ids=np.asarray(ids, dtype=np.int64),
            turns=np.asarray(turn_tags, dtype=np.int32),
            roles=np.asarray(role_tags, dtype=np.int8),
            turn_starts=tuple(turn_starts),
            action_spans=tuple(action_spans),
        )

    def prompt_ids(self, question: str, turns: Sequence[Turn]) -> list[int]:
        """Ids of the context in which the policy writes the next turn: the history (each past
        turn with its observation), then the assistant opening, ending right before `<think>`."""
        rendered = self.render_turns(question, turns)
        ids = rendered.input_ids.tolist()
        if turns:
            ids.extend(self.encode(self.wrappers.user_to_assistant))
        return ids

    @property
    def open_ids(self) -> tuple[int, ...]:
        return self.encode(OPEN_MARKER)

    @property
    def close_ids(self) -> tuple[int, ...]:
        return self.encode(CLOSE_MARKER)

    @property
    def end_ids(self) -> tuple[int, ...]:
        return self.encode(self.wrappers.assistant_end)
