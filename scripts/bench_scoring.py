"""Benchmark (not a test): cover scoring, naive vs full-forward vs ours (hf, vllm) vs the work bound.

    python scripts/bench_scoring.py [--models tiny 20m] [--turns 8 | --sweep] [--json FILE] [--record]
    python scripts/bench_scoring.py --memory --models tiny      # peak RSS, N=64 vs N=512

The same as `race bench scoring`; see the `bench/` package (bench/scoring.py, bench/memory.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
