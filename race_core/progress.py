"""The cover's progress as a person reads it: work done of the work predicted, rate and time left.

Work is counted in the tokens of the work bound (`bench.baselines.bound_tokens`): every trajectory
once up to its last action (round 0), then for each candidate the suffix from its removed reasoning
to the last action. The bound is known before the cover runs, from one rendering of each trajectory:
it does not depend on the decisions (an accepted removal shortens a later candidate before and after
the point where it diverges alike). A finished round adds what the bound gives its candidates, so
done reaches the total exactly when the cover ends, and the rate and ETA are in the same units
whatever the batching or early rejection. Without a renderer (a plain scorer) only candidates are
counted.

Shards arrive one at a time; with the number of trajectories known, the total is extrapolated from
the shards begun so far (their mean predicted work per trajectory). A terminal gets a one-line bar
on stderr, redrawn in place; any other output a plain line logged (this module's logger, INFO) at the
first round and then at most every `interval_s` seconds; `publish` receives the same
`ProgressFigures` after every round (data, for a progress display such as Prefect's artifact).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

import numpy as np

from race_core.render import Renderer, Role
from race_core.schema import Trajectory

LINE_INTERVAL_S = 15.0  # plain progress lines (output not a terminal): at most one per this many seconds

logger = logging.getLogger(__name__)


def bound_tokens_by_round(trajectory: Trajectory, renderer: Renderer) -> list[int]:
    """Per round of the cover (0: the first scoring of the whole trajectory; t >= 1: candidate t),
    the tokens of the work bound for this trajectory: the rendered ids up to the last action, then
    for candidate t those from its first reasoning token on, less its reasoning; 0 where round t has
    no candidate (turn 0, empty reasoning)."""
    turns = trajectory.turns
    rendered = renderer.render(trajectory)
    end = rendered.action_spans[-1][1]
    reasoning = rendered.roles == int(Role.REASONING)
    out = [end]
    for t in range(1, len(turns)):
        tokens = np.flatnonzero(reasoning & (rendered.turns == t))
        start = int(tokens[0]) if tokens.size else rendered.turn_starts[t]
        out.append(end - start - tokens.size if turns[t].reasoning else 0)
    return out


@dataclass(frozen=True)
class ProgressFigures:
    """Where the cover stands: done of the predicted totals, the rate and the time left."""

    tokens_done: int
    tokens_total: int  # the work bound's (0: not counted, no renderer)
    candidates_done: int
    candidates_total: int
    trajectories_begun: int  # in the shards scored so far or now
    trajectories_total: int | None  # None: not known, the totals cover the shards begun
    elapsed_s: float  # since the first shard began

    @property
    def fraction(self) -> float:
        done, total = ((self.tokens_done, self.tokens_total) if self.tokens_total
                       else (self.candidates_done, self.candidates_total))
        return min(1.0, done / total) if total else 0.0

    @property
    def rate(self) -> float:
        """Tokens (candidates when tokens are not counted) per second so far."""
        done = self.tokens_done if self.tokens_total else self.candidates_done
        return done / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        rate = self.rate
        if not rate:
            return None
        remaining = (self.tokens_total - self.tokens_done if self.tokens_total
                     else self.candidates_total - self.candidates_done)
        return max(0.0, remaining / rate)

    def summary(self) -> str:
        """`12,345/30,000 tokens (41%), 40/96 candidates, 850 tokens/s, elapsed 0:15, ETA 0:21`."""
        if self.tokens_total:
            work = f"{self.tokens_done:,}/{self.tokens_total:,} tokens ({100 * self.fraction:.0f}%)"
            rate = f"{self.rate:,.0f} tokens/s"
        else:
            work, rate = f"{100 * self.fraction:.0f}%", f"{self.rate:,.1f} candidates/s"
        eta = "?" if self.eta_s is None else _clock(self.eta_s)
        return (f"{work}, {self.candidates_done:,}/{self.candidates_total:,} candidates, {rate}, "
                f"elapsed {_clock(self.elapsed_s)}, ETA {eta}")


def combine_figures(parts: Sequence[tuple[ProgressFigures | None, int, bool]], elapsed_s: float
                    ) -> ProgressFigures | None:
    """The progress of one cover split between processes (a pool's child runs). Each part is (its
    latest figures or None when not heard from yet, its trajectories, whether it has finished). A
    part not heard from is predicted at the mean work per trajectory of those heard; a finished
    part counts as all done. None until some part has reported."""
    heard = [(f, n) for f, n, _ in parts if f is not None]
    if not heard:
        return None
    trajectories = sum(f.trajectories_total or n for f, n in heard) or 1
    tokens_each = sum(f.tokens_total for f, _ in heard) / trajectories
    candidates_each = sum(f.candidates_total for f, _ in heard) / trajectories
    tokens_done = tokens_total = candidates_done = candidates_total = begun = 0
    for figures, n, finished in parts:
        tokens, candidates = ((figures.tokens_total, figures.candidates_total) if figures is not None
                              else (round(tokens_each * n), round(candidates_each * n)))
        tokens_total, candidates_total = tokens_total + tokens, candidates_total + candidates
        if finished:
            tokens_done, candidates_done, begun = tokens_done + tokens, candidates_done + candidates, begun + n
        elif figures is not None:
            tokens_done += figures.tokens_done
            candidates_done += figures.candidates_done
            begun += figures.trajectories_begun
    return ProgressFigures(tokens_done=tokens_done, tokens_total=tokens_total, candidates_done=candidates_done,
                           candidates_total=candidates_total, trajectories_begun=begun,
                           trajectories_total=sum(n for _, n, _ in parts), elapsed_s=elapsed_s)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class CoverProgress:
    """Follows one cover stage over its shards and shows where it stands (see the module docstring).

    `shard(trajectories, renderer)` before each shard gives the `progress` callback of
    `race_core.cover.logic_cover` for it; `skip(n)` counts trajectories that will not be scored (too
    long); `mark()` and `rewind(mark)` take back a shard's counts (it is scored again);
    `log(message, level)` logs a line without breaking the bar; `close()` ends the display."""

    def __init__(self, trajectories_total: int | None = None, *,
                 publish: Callable[[ProgressFigures], None] | None = None, stream: TextIO | None = None,
                 bar: bool | None = None, interval_s: float = LINE_INTERVAL_S):
        self.stream = stream or sys.stderr
        self.trajectories_total = trajectories_total
        self._publish = publish
        self._use_bar = self.stream.isatty() if bar is None else bar
        self._interval_s = interval_s
        self._bar = None
        self._started: float | None = None
        self._last_line: float | None = None
        self._unshown: str | None = None  # the latest plain line, when not yet written
        self._begun = self._skipped = 0
        self._tokens_predicted = self._candidates_predicted = 0
        self._tokens_done = self._candidates_done = 0
        self.figures: ProgressFigures | None = None  # after the latest round

    def shard(self, trajectories: Sequence[Trajectory], renderer: Renderer | None
              ) -> Callable[[int, int, int], None]:
        """Count this shard's predicted work; the callback to pass to `logic_cover` for it."""
        if self._started is None:
            self._started = time.monotonic()
        bounds = [bound_tokens_by_round(t, renderer) for t in trajectories] if renderer is not None else []
        round_tokens = [sum(b[t] for b in bounds if t < len(b)) for t in range(max(map(len, bounds), default=0))]
        first = self._begun + self._skipped
        self._begun += len(trajectories)
        self._tokens_predicted += sum(round_tokens)
        self._candidates_predicted += sum(t > 0 and bool(turn.reasoning)
                                          for x in trajectories for t, turn in enumerate(x.turns))
        label = f"trajectories {first + 1}-{first + len(trajectories)}"
        if self.trajectories_total is not None:
            label += f" of {self.trajectories_total}"

        def progress(t: int, candidates: int, last_round: int) -> None:
            self._tokens_done += round_tokens[t] if t < len(round_tokens) else 0
            self._candidates_done += candidates if t else 0
            scored = f"{candidates} candidates" if t else f"{candidates} trajectories in full"
            self._update(f"cover: {label}: round {t}/{last_round}, {scored}")

        return progress

    def mark(self) -> tuple[int, ...]:
        """The counts so far, for `rewind` (a shard scored again after it ran out of memory)."""
        return (self._begun, self._skipped, self._tokens_predicted, self._candidates_predicted, self._tokens_done,
                self._candidates_done)

    def rewind(self, mark: tuple[int, ...]) -> None:
        """Take back what was counted since `mark`."""
        (self._begun, self._skipped, self._tokens_predicted, self._candidates_predicted, self._tokens_done,
         self._candidates_done) = mark

    def skip(self, n: int) -> None:
        """`n` trajectories of the input will not be scored: they leave the predicted work."""
        self._skipped += n

    def log(self, message: str, level: int = logging.INFO) -> None:
        if self._bar is not None:
            self._bar.clear()
            logger.log(level, message)
            self._bar.refresh()
        else:
            logger.log(level, message)

    def close(self) -> None:
        """End the bar (left on screen) or write the latest plain line if it was held back."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._unshown is not None:
            logger.info(self._unshown)
            self._unshown = None

    def _totals(self) -> tuple[int, int]:
        """Predicted (tokens, candidates): those of the shards begun, plus their mean per trajectory
        for each trajectory still to come."""
        left = max(0, self.trajectories_total - self._begun - self._skipped) if self.trajectories_total else 0
        share = left / self._begun if self._begun else 0.0
        return (self._tokens_predicted + round(share * self._tokens_predicted),
                self._candidates_predicted + round(share * self._candidates_predicted))

    def _update(self, where: str) -> None:
        now = time.monotonic()
        tokens_total, candidates_total = self._totals()
        self.figures = ProgressFigures(
            tokens_done=self._tokens_done, tokens_total=tokens_total, candidates_done=self._candidates_done,
            candidates_total=candidates_total, trajectories_begun=self._begun,
            trajectories_total=self.trajectories_total,
            elapsed_s=now - (now if self._started is None else self._started))
        if self._publish is not None:
            self._publish(self.figures)
        if self._use_bar:
            self._draw(self.figures)
            return
        line = f"{where}; {self.figures.summary()}"
        if self._last_line is None or now - self._last_line >= self._interval_s:
            logger.info(line)
            self._last_line, self._unshown = now, None
        else:
            self._unshown = line

    def _draw(self, figures: ProgressFigures) -> None:
        if self._bar is None:
            from tqdm import tqdm

            sized = _columns(self.stream) > 0  # a terminal that reports no size gets a fixed width
            self._bar = tqdm(total=1000, file=self.stream, dynamic_ncols=sized, ncols=None if sized else 120,
                             bar_format="cover |{bar}| {desc}")
        self._bar.n = round(1000 * figures.fraction)
        self._bar.set_description_str(figures.summary(), refresh=False)
        self._bar.refresh()


def _columns(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 0
