"""Safe evaluator of the bounded calculator (docs/architecture.md §6); usable on its own.

Our own tokenizer and recursive-descent parser over + - * / (with × and ÷ as aliases),
parentheses, unary minus, integer and decimal literals, computed exactly with `Fraction`.
No eval/exec/compile/ast. Limits: expression length ≤ 64 characters, parenthesis nesting ≤ 8,
|every literal and intermediate value| ≤ 1e12 (numerator and denominator).
`evaluate` never raises: every failure is an `EvalResult` with an error text.
Values are written as an integer when the denominator is 1, else as the reduced fraction
"p/q" (`format_value`), never as a decimal, so observations are exact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

MAX_EXPRESSION_CHARS = 64
MAX_NESTING = 8
MAX_ABS_VALUE = 10**12

ERROR_PREFIX = "Error: "


class EvalError(ValueError):
    """An expression the calculator refuses; the message is the observation text after 'Error: '."""


@dataclass(frozen=True)
class Num:
    value: Fraction


@dataclass(frozen=True)
class Neg:
    operand: Node


@dataclass(frozen=True)
class BinOp:
    op: str  # one of + - * / (aliases × ÷ are normalised at tokenization)
    left: Node
    right: Node


Node = Num | Neg | BinOp

_OPERATORS = {"+": "+", "-": "-", "*": "*", "/": "/", "×": "*", "÷": "/"}
_DIGITS = frozenset("0123456789")  # ASCII only: str.isdigit() also accepts '²' and other scripts


@dataclass(frozen=True)
class EvalResult:
    """Outcome of `evaluate`: exactly one of `value` and `error` is set."""

    value: Fraction | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def text(self) -> str:
        """The observation text: the formatted value, or 'Error: <reason>'."""
        if self.value is not None:
            return format_value(self.value)
        return ERROR_PREFIX + (self.error or "unknown")


def format_value(value: Fraction | int) -> str:
    """An integer when the denominator is 1, else the reduced fraction 'p/q' (sign on p)."""
    return str(Fraction(value))


def _tokenize(expr: str) -> list[tuple[str, Fraction | str, int]]:
    """Tokens as (kind, payload, position); kind is 'num', 'op', '(' or ')'."""
    tokens: list[tuple[str, Fraction | str, int]] = []
    i, n = 0, len(expr)
    while i < n:
        ch = expr[i]
        if ch.isspace():
            i += 1
        elif ch in _DIGITS:
            start = i
            while i < n and expr[i] in _DIGITS:
                i += 1
            if i < n and expr[i] == ".":
                i += 1
                if i >= n or expr[i] not in _DIGITS:
                    raise EvalError(f"malformed number at position {start}")
                while i < n and expr[i] in _DIGITS:
                    i += 1
            tokens.append(("num", _check_range(Fraction(expr[start:i])), start))
        elif ch in _OPERATORS:
            tokens.append(("op", _OPERATORS[ch], i))
            i += 1
        elif ch in "()":
            tokens.append((ch, ch, i))
            i += 1
        else:
            raise EvalError(f"unexpected character {ch!r} at position {i}")
    return tokens


class _Parser:
    """expr := term (('+'|'-') term)* ; term := unary (('*'|'/') unary)* ;
    unary := '-' unary | primary ; primary := number | '(' expr ')'."""

    def __init__(self, tokens: list[tuple[str, Fraction | str, int]]):
        self.tokens = tokens
        self.pos = 0
        self.depth = 0

    def parse(self) -> Node:
        if not self.tokens:
            raise EvalError("empty expression")
        node = self.expr()
        if self.pos < len(self.tokens):
            raise EvalError(f"unexpected {self._describe()}")
        return node

    def _peek(self) -> tuple[str, Fraction | str, int] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _describe(self) -> str:
        tok = self._peek()
        if tok is None:
            return "end of expression"
        text = format_value(tok[1]) if tok[0] == "num" else tok[1]
        return f"{text!r} at position {tok[2]}"

    def expr(self) -> Node:
        node = self.term()
        while (tok := self._peek()) is not None and tok[0] == "op" and tok[1] in "+-":
            self.pos += 1
            node = BinOp(str(tok[1]), node, self.term())
        return node

    def term(self) -> Node:
        node = self.unary()
        while (tok := self._peek()) is not None and tok[0] == "op" and tok[1] in "*/":
            self.pos += 1
            node = BinOp(str(tok[1]), node, self.unary())
        return node

    def unary(self) -> Node:
        minus = 0
        while (tok := self._peek()) is not None and tok[0] == "op" and tok[1] == "-":
            self.pos += 1
            minus += 1
        node = self.primary()
        for _ in range(minus):
            node = Neg(node)
        return node

    def primary(self) -> Node:
        tok = self._peek()
        if tok is not None and tok[0] == "num":
            self.pos += 1
            return Num(tok[1])  # type: ignore[arg-type]
        if tok is not None and tok[0] == "(":
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise EvalError(f"nesting deeper than {MAX_NESTING} parentheses")
            self.pos += 1
            node = self.expr()
            close = self._peek()
            if close is None or close[0] != ")":
                raise EvalError(f"expected ')' but found {self._describe()}")
            self.pos += 1
            self.depth -= 1
            return node
        raise EvalError(f"expected a number or '(' but found {self._describe()}")


def _check_range(value: Fraction) -> Fraction:
    if abs(value.numerator) > MAX_ABS_VALUE or value.denominator > MAX_ABS_VALUE:
        raise EvalError("value out of range (limit 1e12)")
    return value


def parse_expression(expr: str) -> Node:
    """Parse `expr` into a tree; raise `EvalError` on bad syntax or broken limits."""
    if len(expr) > MAX_EXPRESSION_CHARS:
        raise EvalError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    return _Parser(_tokenize(expr)).parse()


def fold(node: Node) -> Fraction:
    """Exact value of a tree, left operand before right; raise `EvalError` on /0 or overflow."""
    if isinstance(node, Num):
        return _check_range(node.value)
    if isinstance(node, Neg):
        return -fold(node.operand)
    left, right = fold(node.left), fold(node.right)
    if node.op == "+":
        return _check_range(left + right)
    if node.op == "-":
        return _check_range(left - right)
    if node.op == "*":
        return _check_range(left * right)
    if right == 0:
        raise EvalError("division by zero")
    return _check_range(left / right)


def evaluate(expr: str) -> EvalResult:
    """Evaluate a calculator expression. Never raises; failures come back as `error`."""
    if not isinstance(expr, str):
        return EvalResult(None, "expression must be text")
    try:
        return EvalResult(fold(parse_expression(expr)), None)
    except EvalError as exc:
        return EvalResult(None, str(exc))
    except (RecursionError, MemoryError, ArithmeticError, ValueError) as exc:  # defence in depth
        return EvalResult(None, f"cannot evaluate ({type(exc).__name__})")


_NUMBER_RE = re.compile(r"[+-]?[0-9]+(?:\.[0-9]+)?|[+-]?[0-9]+/[0-9]+")


def parse_number(text: str) -> Fraction | None:
    """An integer, 'p/q' or decimal as an exact Fraction; None for anything else (never raises)."""
    if not isinstance(text, str) or len(text) > MAX_EXPRESSION_CHARS:
        return None
    text = text.strip()
    if not _NUMBER_RE.fullmatch(text):
        return None
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):  # "p/0"
        return None
