"""The hf cover with each batch's prefixes copied and read in place, on the same long-workload episodes
in one process: wall time, model calls, KV bytes copied (per fed token), mask bytes, and whether the
decisions are the same (with the largest drop difference over the candidates scored in the same context).

    .venv/bin/python scripts/prefix_in_place.py CHECKPOINT_DIR|20m|tiny [EPISODES] [EPSILON]

(20m, tiny: the bench's synthetic models, built under .race/checkpoints when missing.)
"""

from __future__ import annotations

import sys
import time

from bench.dtypes import decisions, drift
from bench.workload import MODELS, LongWorkload, checkpoint_for, long_trajectories
from race_core.cover import logic_cover
from race_core.cpu import cpu_facts
from race_core.policy import load_policy
from race_core.render import Renderer
from race_core.scoring.hf import HFScorer


def main(argv: list[str]) -> int:
    checkpoint = str(checkpoint_for(argv[0], ".race/checkpoints")) if argv[0] in MODELS else argv[0]
    n = int(argv[1]) if len(argv) > 1 else 4
    epsilon = float(argv[2]) if len(argv) > 2 else 0.3
    model, tokenizer = load_policy(checkpoint)
    renderer = Renderer(tokenizer)
    episodes = long_trajectories(renderer, LongWorkload(n=n, seed=0),
                                 min(int(model.config.get_text_config().max_position_embeddings), 8192))
    cpu = cpu_facts()
    print(f"{checkpoint}: {n} episodes of {[len(t.turns) for t in episodes]} turns, ε {epsilon:g}; "
          f"CPU {cpu['model']} ({', '.join(cpu['matrix_extensions']) or 'none'})")
    covers = {}
    for in_place in (False, True):
        scorer = HFScorer(model, tokenizer, renderer=renderer, batch_size=16, prefix_in_place=in_place)
        began = time.perf_counter()
        covers[in_place] = logic_cover(list(episodes), scorer, epsilon)
        wall, s = time.perf_counter() - began, scorer.stats
        print(f"prefix {'in place' if scorer.in_place else 'copied'}: {wall:.1f} s, {s.forward_calls} forwards, "
              f"{s.decoder_calls} model calls, {s.tokens_processed:,} tokens fed, KV copied {s.kv_bytes_copied / 1e9:.2f} GB "
              f"({s.kv_bytes_copied / max(s.tokens_processed, 1) / 1e3:.1f} KB per fed token), mask {s.mask_bytes:,} bytes",
              flush=True)
    worst, compared = drift(covers[False], covers[True])
    print(f"decisions equal: {decisions(covers[False]) == decisions(covers[True])}; largest drop difference "
          f"{worst:.1e} over {compared} candidates")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
