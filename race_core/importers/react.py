"""ReAct text logs: a record holding the agent's text (`Thought:` / `Action:` / `Action Input:` /
`Observation:` / `Final Answer:` lines, read by `turn_text.react_log`) and its question (a
`question` / `input` / `query` key, or a `Question:` line in the text). Alpaca-style records
(`instruction`, optional `input`, `output`, optional `system`) are read too: the instruction and its
input are the question, the output the ReAct text.

- Text before the first label is a thought, unless a `Question:` line follows it: then it is the
  prompt, the system text.
- An action before the last turn must have its `Observation:`; a text that ends with a Thought
  that no Action follows is refused.
"""

from __future__ import annotations

from typing import Any

from race_core.importers.common import NO_QUESTION, NO_TURNS, Conversation, SkipRecord, joined
from race_core.importers.turn_text import react_log
from race_core.schema import EMPTY_ACTION, MISSING_FIELD, WRONG_TYPE

NAME = "react"
TEXT_KEYS = ("text", "trajectory", "log", "output")  # the first one present holds the ReAct text
QUESTION_KEYS = ("question", "input", "query")
INSTRUCTION = "instruction"  # Alpaca: the question is the instruction and its `input`


def matches(record: dict[str, Any]) -> bool:
    """A string under one of TEXT_KEYS, or an Alpaca `instruction`."""
    return INSTRUCTION in record or any(isinstance(record.get(k), str) for k in TEXT_KEYS)


def convert(record: dict[str, Any], source: str) -> Conversation:
    text_key = next((k for k in TEXT_KEYS if k in record), None)
    if text_key is None:
        raise SkipRecord(MISSING_FIELD, TEXT_KEYS[0], f"the ReAct text is required, under one of {list(TEXT_KEYS)}")
    text = record[text_key]
    if not isinstance(text, str):
        raise SkipRecord(WRONG_TYPE, text_key, f"must be a string, got {type(text).__name__}")
    question, question_keys = _question(record)
    log = react_log(text, text_key)
    if log.trailing_thought:
        raise SkipRecord(EMPTY_ACTION, f"{text_key}: end", "the text ends with a Thought that no Action follows")
    if not log.steps:
        raise SkipRecord(NO_TURNS, text_key, "no Action or Final Answer in the text")
    question = question or log.question
    if not question:
        looked = [INSTRUCTION] if INSTRUCTION in record else list(QUESTION_KEYS)
        raise SkipRecord(NO_QUESTION, looked[0], f"no question: no non-empty {looked} key and no Question: line")
    system = record.get("system") if INSTRUCTION in record else None
    if system is not None and not isinstance(system, str):
        raise SkipRecord(WRONG_TYPE, "system", f"must be a string, got {type(system).__name__}")
    turns = [{"reasoning": s.reasoning, "action": (s.calls[0] if len(s.calls) == 1 else s.calls) if s.calls else s.text,
              "observation": s.observation or ""} for s in log.steps]
    return Conversation(question=question, turns=turns, system=joined([(system or "").strip(), log.prompt], "\n\n"),
                        consumed=(text_key, *question_keys, *(("system",) if system is not None else ())))


def _question(record: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """(the question the record's keys give, "" for none; the keys read)."""
    if INSTRUCTION in record:
        keys = (INSTRUCTION, "input")
    else:
        key = next((k for k in QUESTION_KEYS if record.get(k) is not None), None)
        keys = (key,) if key else ()
    texts = []
    for key in keys:
        value = record.get(key)
        if value is not None and not isinstance(value, str):
            raise SkipRecord(WRONG_TYPE, key, f"must be a string, got {type(value).__name__}")
        texts.append((value or "").strip())
    return joined(texts, "\n\n"), tuple(k for k in keys if k in record)
