"""Multi-hop lookups in a generated people directory (`--env lookup`): the shape of ReAct and
HotpotQA agents, where a fact read at one turn is what a later action needs.

Every task has its own small directory of invented people (names from made-up syllables, so no
model knows them). `search[<full name>]` answers with that person's entry, one long line of facts:
age, height, years at the company, office floor, parking spot, city, job, manager, best friend,
hobby. `calc[<a> <op> <b>]` evaluates ONE operation (+ - *) on two integers;
`finish[<number>]` answers and ends the episode. Anything else observes an "invalid action" text
and uses a turn of the budget.

A question combines numbers from the entries of three or four people with plus / minus:

- `hop`: "the age of A's manager plus B's height in cm": search A (names the manager M), search M,
  search B, calc, finish: 5 turns;
- `triple`: "A's age plus B's floor minus C's years at the company": search A, search B, calc,
  search C, calc, finish: 6 turns;
- `hop2`: "the age of A's manager minus the height of B's best friend": search A, M, B, F, calc,
  finish: 6 turns.

No task can be won in fewer than 4 turns: each number is only in its own person's entry (a
manager's or a friend's name only in the entry that names them), so three entries must be searched
one per turn before any finish, with or without the calculator. The answer (private: read only by
`judge`) is exact integer arithmetic of the numbers, left to right. Tasks are split into train and
held-out by a hash of the question, as the calculator's are.

The scripted expert plays as a careful agent writes: turn 0 states the plan; after a search it notes
the fact it read (`current` when this turn's action uses it: a manager's name it searches next, a
number its calc takes; `later` when only a later calc does); after a calc it restates what it has
(`redundant`: everything in it is in the question and the observations), or writes nothing
(`empty_reasoning_share` of those turns). The note is the only short statement of a fact that
otherwise stands in a long entry among a dozen others: removing a `later` note leaves the turn's
own search as likely and makes the later calc less likely, which is what the cross-turn check of
the cover is for.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from race_core.envs.base import (
    CURRENT,
    DEFAULT_EMPTY_REASONING_SHARE,
    EMPTY,
    EXPERT_SOURCE_REVISION,
    HELDOUT_SEED_OFFSET,
    LATER,
    REDUNDANT,
    BudgetEpisode,
    Environment,
    Tool,
    bracketed,
)
from race_core.schema import Trajectory, Turn

ENVIRONMENT_NAME = "people-lookup-v1"
ENV_REVISION = "1"
HELDOUT_PERCENT = 10
PEOPLE_PER_TASK = 8
KINDS_OF_TASK = ("hop", "triple", "hop2")
TASK_WEIGHTS = (0.5, 0.25, 0.25)
ENTRIES_PER_KIND = {"hop": 3, "triple": 3, "hop2": 4}  # `difficulty`: the entries a task needs

QUESTION_TAIL = " Actions: search[<full name>], calc[<number> <op> <number>], finish[<number>]."
INVALID_ACTION_OBSERVATION = ("Invalid action: expected search[<full name>], calc[<number> <op> <number>] "
                              "or finish[<number>].")
CALC_ERROR = "Error: calc takes one operation on two integers, like 12 + 7."

SPECS = (Tool("search", "name", "Look a person up in the directory by full name.", "for example Karo Velmi"),
         Tool("calc", "expression", "One operation (+ - *) on two integers.", "for example 47 + 12"),
         Tool("finish", "answer", "Give the final answer and end the task.", "the number"))
_SYSTEM_HEAD = ("You answer questions about the people in a company directory, one step per turn. Each turn "
                "starts with your reasoning inside <think></think> (it may be empty), then one action.")
SYSTEM_TEXT = (_SYSTEM_HEAD + "\nWrite it on a new line: `Action: search[<full name>]` reads a person's entry, "
               "`Action: calc[<number> <op> <number>]` does one operation, `Action: finish[<number>]` answers.")
SYSTEM_TOOLS = (_SYSTEM_HEAD + "\nThe action is one call of a tool: search to read a person's entry, calc for one "
                "operation, finish to answer.")

_SYLLABLES = ("ka", "ro", "mi", "ten", "vel", "dor", "sa", "lin", "bra", "ku", "ne", "tas", "il", "mo", "ren",
              "zu", "fa", "gel", "or", "pim", "da", "vek", "lu", "sor", "ti", "mar", "en", "qua", "bel", "nox")
_CITIES = ("Dunmere", "Kelport", "Ashvale", "Norwick", "Tarsey", "Hollin", "Brisk", "Palmera")
_JOBS = ("pilot", "baker", "engineer", "teacher", "chemist", "gardener", "lawyer", "painter", "nurse", "tailor")
_HOBBIES = ("chess", "rowing", "pottery", "birding", "fencing", "sailing", "poetry", "cycling", "origami")

# number attributes a question can ask for: (key, question noun, text in the entry, pattern reading it back)
_ATTRIBUTES = {
    "age": ("age", "age {v}", r"\bage (-?\d+)"),
    "height": ("height in cm", "height {v} cm", r"\bheight (-?\d+) cm"),
    "years": ("years at the company", "{v} years at the company", r"\b(-?\d+) years at the company"),
    "floor": ("office floor", "office on floor {v}", r"\boffice on floor (-?\d+)"),
    "parking": ("parking spot number", "parking spot {v}", r"\bparking spot (-?\d+)"),
}
_RANGES = {"age": (21, 69), "height": (150, 199), "years": (1, 39), "floor": (1, 60), "parking": (1, 99)}
_RELATIONS = {"manager": ("manager", r"\bmanager ([A-Z][a-z]+ [A-Z][a-z]+)"),
              "friend": ("best friend", r"\bbest friend ([A-Z][a-z]+ [A-Z][a-z]+)")}
_OPS = {"plus": "+", "minus": "-"}
_CALC_RE = re.compile(r"^\s*(-?\d{1,12})\s*([+\-*])\s*(-?\d{1,12})\s*$")


@dataclass(frozen=True)
class Person:
    name: str
    numbers: tuple[tuple[str, int], ...]  # attribute key -> value, in entry order
    city: str
    job: str
    manager: str
    friend: str
    hobby: str

    def number(self, attribute: str) -> int:
        return dict(self.numbers)[attribute]

    def related(self, relation: str) -> str:
        return self.manager if relation == "manager" else self.friend

    def entry(self) -> str:
        """What `search[name]` observes: every fact of the person, one line."""
        numbers = dict(self.numbers)
        parts = [_ATTRIBUTES["age"][1].format(v=numbers["age"]), _ATTRIBUTES["height"][1].format(v=numbers["height"]),
                 _ATTRIBUTES["years"][1].format(v=numbers["years"]), _ATTRIBUTES["floor"][1].format(v=numbers["floor"]),
                 _ATTRIBUTES["parking"][1].format(v=numbers["parking"]),
                 f"lives in {self.city}", f"works as a {self.job}", f"manager {self.manager}",
                 f"best friend {self.friend}", f"hobby {self.hobby}"]
        return f"{self.name}: " + ", ".join(parts) + "."


@dataclass(frozen=True)
class Term:
    """One number of a question: `attribute` of `name`, or of the person `relation` of `name`."""

    name: str
    attribute: str
    relation: str = ""

    def text(self) -> str:
        noun = _ATTRIBUTES[self.attribute][0]
        if self.relation:
            return f"the {noun} of {self.name}'s {_RELATIONS[self.relation][0]}"
        return f"{self.name}'s {noun}"


@dataclass(frozen=True)
class LookupTask:
    task_id: str
    question: str
    answer: int  # private: read only by `judge`
    people: tuple[Person, ...]  # the directory `search` reads (the agent sees only what it searches)
    kind: str  # hop, triple or hop2
    entries: int  # the entries a win needs to read

    @property
    def environment(self) -> Lookup:
        return LOOKUP

    def find(self, name: str) -> Person | None:
        wanted = " ".join(name.split()).lower()
        return next((p for p in self.people if p.name.lower() == wanted), None)


def question_text(terms: Sequence[Term], ops: Sequence[str]) -> str:
    """The question for terms joined by op words (`plus`, `minus`), left to right."""
    core = terms[0].text()
    for op, term in zip(ops, terms[1:], strict=True):
        core += f" {op} {term.text()}"
    return f"What is {core}?{QUESTION_TAIL}"


_TERM_RE = re.compile(r"^(?:the (?P<noun_r>.+?) of (?P<name_r>[A-Z][a-z]+ [A-Z][a-z]+)'s (?P<rel>manager|best friend)"
                      r"|(?P<name>[A-Z][a-z]+ [A-Z][a-z]+)'s (?P<noun>.+))$")
_NOUNS = {noun: key for key, (noun, _, _) in _ATTRIBUTES.items()}
_RELATION_KEYS = {text: key for key, (text, _) in _RELATIONS.items()}


def parse_question(question: str) -> tuple[list[Term], list[str]]:
    """The terms and op words of a question written by `question_text` (what an agent reads)."""
    if not question.startswith("What is ") or "?" not in question:
        raise ValueError(f"not a lookup question: {question!r}")
    words = re.split(r" (plus|minus) ", question[len("What is "):question.index("?")])
    terms, ops = [], words[1::2]
    for text in words[0::2]:
        match = _TERM_RE.match(text)
        if match is None:
            raise ValueError(f"not a term of a lookup question: {text!r}")
        if match["rel"]:
            terms.append(Term(match["name_r"], _NOUNS[match["noun_r"]], _RELATION_KEYS[match["rel"]]))
        else:
            terms.append(Term(match["name"], _NOUNS[match["noun"]]))
    return terms, ops


def _apply(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def task_split(question: str) -> str:
    """'heldout' for a fixed ~10% of questions (by sha256), 'train' for the rest."""
    bucket = int.from_bytes(hashlib.sha256(question.encode("utf-8")).digest()[:4], "big") % 100
    return "heldout" if bucket < HELDOUT_PERCENT else "train"


def _names(rng: random.Random, n: int) -> list[str]:
    names: list[str] = []
    firsts: set[str] = set()
    while len(names) < n:
        first = "".join(rng.sample(_SYLLABLES, 2)).capitalize()
        last = "".join(rng.sample(_SYLLABLES, rng.choice((2, 3)))).capitalize()
        if first not in firsts and first.lower() != last.lower():  # first names alone tell people apart
            firsts.add(first)
            names.append(f"{first} {last}")
    return names


def _directory(rng: random.Random) -> list[Person]:
    names = _names(rng, PEOPLE_PER_TASK)
    people = []
    for k, name in enumerate(names):
        others = [n for j, n in enumerate(names) if j != k]
        manager, friend = rng.sample(others, 2)
        numbers = tuple((key, rng.randint(*_RANGES[key])) for key in _ATTRIBUTES)
        people.append(Person(name, numbers, rng.choice(_CITIES), rng.choice(_JOBS), manager, friend,
                             rng.choice(_HOBBIES)))
    return people


def _draw(rng: random.Random, kind: str) -> tuple[list[Person], list[Term], list[str]]:
    people = _directory(rng)
    attributes = list(_ATTRIBUTES)
    while True:
        if kind == "triple":
            chosen = rng.sample(people, 3)
            terms = [Term(p.name, rng.choice(attributes)) for p in chosen]
            needed = [p.name for p in chosen]
        else:
            a, b = rng.sample(people, 2)
            first = Term(a.name, rng.choice(attributes), "manager")
            second = (Term(b.name, rng.choice(attributes), "friend") if kind == "hop2"
                      else Term(b.name, rng.choice(attributes)))
            needed = [a.name, a.manager, b.name] + ([b.friend] if kind == "hop2" else [])
            terms = [first, second]
        if len(set(needed)) == len(needed):  # every entry searched is a new one
            return people, terms, [rng.choice(tuple(_OPS)) for _ in terms[1:]]


def _value(task_people: Sequence[Person], term: Term) -> int:
    by_name = {p.name: p for p in task_people}
    person = by_name[term.name]
    if term.relation:
        person = by_name[person.related(term.relation)]
    return person.number(term.attribute)


def generate_tasks(n: int, seed: int, difficulty: int | None = None, split: str | None = None,
                   shape: str = "random") -> list[LookupTask]:
    """`n` distinct tasks drawn with `random.Random(seed)`; deterministic given the arguments.
    difficulty: the entries a task needs (3: hop or triple, 4: hop2; None: every kind, weighted
    `TASK_WEIGHTS`). split None: 'heldout' for seeds >= HELDOUT_SEED_OFFSET, else 'train'."""
    LOOKUP.check(shape, difficulty)
    if split is None:
        split = "heldout" if seed >= HELDOUT_SEED_OFFSET else "train"
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    kinds = [k for k in KINDS_OF_TASK if difficulty is None or ENTRIES_PER_KIND[k] == difficulty]
    weights = [w for k, w in zip(KINDS_OF_TASK, TASK_WEIGHTS, strict=True) if k in kinds]
    rng = random.Random(f"lookup:{seed}")
    tasks: list[LookupTask] = []
    seen: set[str] = set()
    while len(tasks) < n:
        kind = rng.choices(kinds, weights)[0]
        people, terms, ops = _draw(rng, kind)
        question = question_text(terms, ops)
        if question in seen or task_split(question) != split:
            continue
        seen.add(question)
        answer = _value(people, terms[0])
        for op, term in zip(ops, terms[1:], strict=True):
            answer = _apply(_OPS[op], answer, _value(people, term))
        digest = hashlib.sha256(question.encode("utf-8")).hexdigest()[:16]
        tasks.append(LookupTask(f"lookup-{digest}", question, answer, tuple(people), kind, ENTRIES_PER_KIND[kind]))
    return tasks


def judge(task: LookupTask, finish_value_text: str) -> bool:
    """Private success check: the finished number equals the answer. The only reader of `task.answer`."""
    text = finish_value_text.strip()
    return re.fullmatch(r"-?\d{1,15}", text) is not None and int(text) == task.answer


def calculate(expression: str) -> str:
    """`a op b` of two integers (op + - *), as text; anything else is the calc error text."""
    match = _CALC_RE.match(expression)
    if match is None:
        return CALC_ERROR
    return str(_apply(match[2], int(match[1]), int(match[3])))


class LookupEnv(BudgetEpisode):
    """One episode on one task; each `step` uses one turn of the budget, whatever the action."""

    tools = SPECS

    def act(self, text: str) -> str:
        if (name := bracketed(text, "search")) is not None:
            person = self.task.find(name)
            return person.entry() if person else f"No entry for {name.strip()!r}. Search takes a full name."
        if (expression := bracketed(text, "calc")) is not None:
            return calculate(expression)
        if (answer := bracketed(text, "finish")) is not None:
            return self.finish(judge(self.task, answer))
        return INVALID_ACTION_OBSERVATION


# The expert's texts. A kind is read back from the text alone (`reasoning_kind`), as for the calculator.
_PLAN = ("The question needs {count} numbers from the directory. First I search {first}.",
         "I look the people up one at a time, then combine the numbers. I start with {first}.")
_RELATION_NOTE = ("{name}'s {relation} is {other}.", "The entry names {other} as {name}'s {relation}.")
_CURRENT_NOTE = ("{fact} is {value}.", "The entry gives {fact}: {value}.")
_LATER_NOTE = ("Noted for later: {fact} is {value}.", "{fact} is {value}; I keep that for the calculation.")
_RESTATE_STEP = ("So far {facts}, and {calc}. One more number is needed.",
                 "I have {facts}. The calculator gave {calc}. The question still needs one more number.")
_RESTATE_FINAL = ("All the numbers are known: {facts}. The calculator gave {result}, so the answer is {result}.",
                  "With {facts}, the question comes to {result}. I give the answer {result}.")


def _pattern(templates: Sequence[str]) -> re.Pattern[str]:
    parts = [re.sub(r"\\\{\w+\\\}", ".+?", re.escape(t)) for t in templates]
    return re.compile("^(?:" + "|".join(parts) + ")$")


_LATER_RE = _pattern(_LATER_NOTE)
_CURRENT_RE = _pattern(_CURRENT_NOTE + _RELATION_NOTE)
_RESTATE_RE = _pattern(_RESTATE_STEP + _RESTATE_FINAL)


def reasoning_kind(reasoning: str) -> str:
    """The kind of a reasoning text written the expert's way: a note kept for later, a note used now
    (a number or a name), anything else `redundant`, no text `empty`."""
    if not reasoning:
        return EMPTY
    if _RESTATE_RE.match(reasoning):
        return REDUNDANT
    if _LATER_RE.match(reasoning):
        return LATER
    return CURRENT if _CURRENT_RE.match(reasoning) else REDUNDANT


class LookupExpert:
    """A `run_episode` policy for one episode: reads the question, then each observation; never reads
    the task's answer or directory. `kinds[t]` is turn t's reasoning kind."""

    def __init__(self, rng: random.Random, empty_reasoning_share: float = DEFAULT_EMPTY_REASONING_SHARE):
        if not 0.0 <= empty_reasoning_share <= 1.0:
            raise ValueError(f"empty_reasoning_share must be in [0, 1], got {empty_reasoning_share}")
        self.rng = rng
        self.empty_reasoning_share = empty_reasoning_share
        self.kinds: list[str] = []
        self.steps: list[tuple] = []

    def _plan(self, question: str) -> None:
        terms, ops = parse_question(question)
        self.terms, self.ops = terms, [_OPS[o] for o in ops]
        for i, term in enumerate(terms):  # ("relation", i) | ("value", i) | ("calc", i) | ("finish",)
            if term.relation:
                self.steps.append(("relation", i))
            self.steps.append(("value", i))
            if i >= 1:
                self.steps.append(("calc", i))
        self.steps.append(("finish",))
        self.values: dict[int, int] = {}
        self.related: dict[int, str] = {}
        self.results: list[int] = []
        self.calcs: list[str] = []  # the calc expressions written so far

    def _read(self, step: tuple, observation: str) -> str:
        """What the previous step's observation says (a name, a number), recorded; its fact as text."""
        kind, i = step[0], step[1] if len(step) > 1 else None
        term = self.terms[i] if i is not None else None
        if kind == "relation":
            found = re.search(_RELATIONS[term.relation][1], observation)
            if found is None:
                raise RuntimeError(f"unexpected observation in expert episode: {observation!r}")
            self.related[i] = found[1]
            return found[1]
        if kind == "value":
            found = re.search(_ATTRIBUTES[term.attribute][2], observation)
            if found is None:
                raise RuntimeError(f"unexpected observation in expert episode: {observation!r}")
            self.values[i] = int(found[1])
            return found[1]
        self.results.append(int(observation))
        return observation

    def _facts(self, upto: int) -> str:
        return " and ".join(f"{self.terms[j].text()} is {self.values[j]}" for j in range(upto + 1))

    def __call__(self, question: str, turns: Sequence[Turn]) -> tuple[str, str]:
        k = len(turns)
        if k == 0:
            self._plan(question)
        step = self.steps[k]
        if k > 0:
            self._read(self.steps[k - 1], turns[-1].observation)
        # the action of this step
        if step[0] == "relation":
            action = f"search[{self.terms[step[1]].name}]"
        elif step[0] == "value":
            i = step[1]
            action = f"search[{self.related[i] if self.terms[i].relation else self.terms[i].name}]"
        elif step[0] == "calc":
            i = step[1]
            self.calcs.append(f"{self.values[0] if i == 1 else self.results[-1]} {self.ops[i - 1]} {self.values[i]}")
            action = f"calc[{self.calcs[-1]}]"
        else:
            action = f"finish[{self.results[-1]}]"
        # the reasoning: what the last observation gave, as the agent needs it
        if k == 0:
            count = ("two", "three")[len(self.terms) - 2]
            reasoning, kind = self.rng.choice(_PLAN).format(count=count, first=self.terms[0].name), REDUNDANT
        else:
            previous = self.steps[k - 1]
            if previous[0] == "relation":
                term = self.terms[previous[1]]
                reasoning = self.rng.choice(_RELATION_NOTE).format(
                    name=term.name, relation=_RELATIONS[term.relation][0], other=self.related[previous[1]])
                kind = CURRENT
            elif previous[0] == "value":
                i = previous[1]
                used_now = step[0] == "calc"
                fact = self.terms[i].text()
                fact = fact[0].upper() + fact[1:]
                reasoning = self.rng.choice(_CURRENT_NOTE if used_now else _LATER_NOTE).format(
                    fact=fact, value=self.values[i])
                kind = CURRENT if used_now else LATER
            else:
                i = previous[1]
                calc = f"{self.calcs[-1]} = {self.results[-1]}"
                if step[0] == "finish":
                    reasoning = self.rng.choice(_RESTATE_FINAL).format(facts=self._facts(i), result=self.results[-1])
                else:
                    reasoning = self.rng.choice(_RESTATE_STEP).format(facts=self._facts(i), calc=calc)
                kind = REDUNDANT
                if self.rng.random() < self.empty_reasoning_share:
                    reasoning, kind = "", EMPTY
        self.kinds.append(kind)
        return reasoning, action


class Lookup(Environment):
    """The people directory as an `Environment` (module docstring)."""

    name = "lookup"
    environment = ENVIRONMENT_NAME
    revision = ENV_REVISION
    shapes = ("random",)
    difficulties = (3, 4)
    tools = SPECS
    system_text = SYSTEM_TEXT
    system_tools = SYSTEM_TOOLS

    def generate_tasks(self, n: int, seed: int, difficulty: int | None = None, split: str | None = None,
                       shape: str = "random") -> list[LookupTask]:
        return generate_tasks(n, seed, difficulty, split, shape)

    def episode(self, task: LookupTask, max_turns: int) -> LookupEnv:
        return LookupEnv(task, max_turns)

    def expert_dataset(self, n: int, seed: int, difficulty: int | None = None,
                       empty_reasoning_share: float = DEFAULT_EMPTY_REASONING_SHARE,
                       source_revision: str = EXPERT_SOURCE_REVISION, reasoning_kinds: bool = False,
                       shape: str = "random") -> list[Trajectory]:
        from race_core.envs.calculator import DEFAULT_MAX_TURNS

        rng = random.Random(f"lookup-expert:{seed}")
        out = []
        for task in generate_tasks(n, seed, difficulty, shape=shape):
            policy = LookupExpert(rng, empty_reasoning_share)
            episode = self.run_episode(task, policy, DEFAULT_MAX_TURNS)
            if episode.success:
                trajectory = episode.to_trajectory(source_revision=source_revision)
                if reasoning_kinds:
                    trajectory = replace(trajectory, extra={**trajectory.extra, "reasoning_kinds": policy.kinds})
                out.append(trajectory)
        return out

    def reasoning_kind(self, reasoning: str) -> str:
        return reasoning_kind(reasoning)


LOOKUP = Lookup()
