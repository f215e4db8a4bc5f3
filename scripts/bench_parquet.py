"""Benchmark (not a test): stream decision rows through the Parquet writer; memory must stay flat.

    python scripts/bench_parquet.py [--rows 200000] [--out decisions.parquet]

Prints rows, seconds, file size and peak RSS (ru_maxrss). Target: peak RSS under 300 MB.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from race_core.config import DEFAULT_EPSILON  # noqa: E402
from storage.parquet import DatasetWriter  # noqa: E402


def decision_rows(n: int, seed: int = 0) -> Iterator[dict]:
    """Synthetic decisions: ~8 candidate turns per trajectory, d_j lists shrinking with the turn."""
    rng = random.Random(seed)
    model = "ab" * 32
    for i in range(n):
        turn = i % 8
        skipped_empty = rng.random() < 0.05
        drops = [] if skipped_empty else [rng.gauss(0.0, DEFAULT_EPSILON) for _ in range(8 - turn)]
        max_drop = max(drops) if drops else None
        accepted = max_drop is not None and max_drop <= DEFAULT_EPSILON
        yield {
            "trajectory_id": f"{i // 8:064x}",
            "turn": turn,
            "accepted": accepted,
            "skipped_empty": skipped_empty,
            "drops": drops,
            "max_drop": max_drop,
            "reasoning_tokens": rng.randint(0, 400),
            "action_tokens": rng.randint(1, 60),
            "epsilon": DEFAULT_EPSILON,
            "model_digest": model,
            "backend": "hf",
            "render_mode": "canonical/keeps-reasoning",
            "reason": None if accepted else ("empty_reasoning" if skipped_empty else "over_epsilon"),
        }


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MB (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--row-group-size", type=int, default=8192)
    parser.add_argument("--out", default=None, help="output path (default: a temp file, removed)")
    args = parser.parse_args()

    rss_before = peak_rss_mb()
    with tempfile.TemporaryDirectory() as tmpdir:
        out = Path(args.out) if args.out else Path(tmpdir) / "decisions.parquet"
        start = time.perf_counter()
        with DatasetWriter("decisions", out, row_group_size=args.row_group_size) as writer:
            writer.write_many(decision_rows(args.rows))
        seconds = time.perf_counter() - start
        size = os.path.getsize(out)
    peak = peak_rss_mb()
    print(f"rows: {writer.rows}")
    print(f"seconds: {seconds:.2f} ({writer.rows / seconds:,.0f} rows/s)")
    print(f"file size: {size / (1 << 20):.2f} MB")
    print(f"peak RSS: {peak:.1f} MB (after imports: {rss_before:.1f} MB; target < 300 MB)")
    if peak >= 300:
        sys.exit("peak RSS over the 300 MB target")


if __name__ == "__main__":
    main()
