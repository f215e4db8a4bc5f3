"""Write the built-in ReAct-style agent trajectories (bench/rendering.py) as contract JSONL, for
trying `race cover` / `race run` on a real instruct checkpoint offline.

    python scripts/react_sample.py --n 24 --out runs/react.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rendering import react_trajectories  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=24)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in react_trajectories(args.n)))
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
