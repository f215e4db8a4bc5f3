"""Where the hf scorer's time goes, forward by forward: one cover under `torch.profiler`.

The scorer names its steps (`race_core.scoring.hf`): each batched forward is a range
`hf.forward rows=R prefix=P fed=F`, and within it `hf.kv_fill` (the reused prefixes copied into the
batch's cache), `hf.decoder` (the model's calls), `hf.head` and `hf.keep` (the fed tokens' keys and
values copied out into kept copies); with prefixes read in place (`race_core.scoring.attention`),
`hf.prefix_attention` (the new tokens over their prefixes, merged into their own attention) and
`hf.kv_write` (the fed tokens' keys and values written into the rows' kept segments) within the
decoder. Every operator the profiler saw inside a forward is put in one part, by the first of these
that holds it:

  kv fill, kv write, keep copies,
  head, prefix attention       the scorer's named steps
  attention                    the rest of attention (`scaled_dot_product_attention` and what it calls)
  matmul                       the layers' matrix products
  copies                       other copies: the copying path's cache writes, concatenations, clones, fills
  other ops                    the rest (norms, rotary embeddings, activations, masks, indexing)
  python                       the forward's time outside any operator (interpreter, dispatch)

Times are the profiler's (wall time on the calling thread), so they carry the machine's load: read
them as shares of one run. `race bench scoring --profile` adds this for hf to each synthetic run.
The prefix attention is its own part because it is what grows with the episode: a candidate's
tokens sit late in their sequence and attend over more positions than the raw forward's tokens do
on average, which the bound with attention (`bench.scoring.attention_bound`) prices.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

PARTS = ("kv fill", "kv write", "keep copies", "head", "prefix attention", "attention", "matmul", "copies",
         "other ops", "python")
_STEPS = {"hf.kv_fill": "kv fill", "hf.kv_write": "kv write", "hf.keep": "keep copies", "hf.head": "head",
          "hf.prefix_attention": "prefix attention"}
_MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm"}
_COPIES = {"aten::copy_", "aten::cat", "aten::clone", "aten::contiguous", "aten::zero_", "aten::fill_",
           "aten::index_put_", "aten::_to_copy", "aten::to", "aten::pad", "aten::constant_pad_nd", "aten::stack"}
_FORWARD = re.compile(r"hf\.forward rows=(\d+) prefix=(\d+) fed=(\d+)")


def _part(name: str, inherited: str | None) -> str | None:
    if inherited is not None:
        return inherited
    if name in _STEPS:
        return _STEPS[name]
    if "scaled_dot_product" in name or "flash_attention" in name:
        return "attention"
    if name in _MATMUL:
        return "matmul"
    return None


def _split(event, inherited: str | None, into: dict[str, float]) -> None:
    """Add the self time of `event` and its descendants to their parts."""
    part = _part(event.name, inherited)
    if not event.name.startswith("hf."):  # a named step's own time is its operators' and Python's
        own = part or ("copies" if event.name in _COPIES else "other ops")
        into[own] = into.get(own, 0.0) + event.self_cpu_time_total / 1e6
    for child in event.cpu_children:
        _split(child, part, into)


def split_forward(event) -> dict[str, Any]:
    """One `hf.forward` range's shape and its time by part (seconds)."""
    rows, prefix, fed = map(int, _FORWARD.fullmatch(event.name).groups())
    parts: dict[str, float] = {}
    for child in event.cpu_children:
        _split(child, None, parts)
    total = event.cpu_time_total / 1e6
    parts["python"] = max(total - sum(parts.values()), 0.0)
    return {"rows": rows, "prefix": prefix, "fed": fed, "seconds": total,
            **{part: parts.get(part, 0.0) for part in PARTS}}


def profile_cover(scorer, trajectories: Sequence, epsilon: float, early_reject: bool = False) -> dict[str, Any]:
    """Run the cover with `scorer` (an `HFScorer`) under the profiler: each forward's time by part,
    the totals, and the time of the steps outside the forwards (rendering rows, planning)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from race_core.cover import logic_cover

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        logic_cover(trajectories, scorer, epsilon, early_reject=early_reject)
    events = prof.events()
    forwards = [split_forward(e) for e in events if _FORWARD.fullmatch(e.name)]
    outside = {name: sum(e.cpu_time_total for e in events if e.name == name) / 1e6 for name in ("hf.rows", "hf.plan")}
    totals = {part: sum(f[part] for f in forwards) for part in PARTS}
    return {"forwards": forwards, "totals": totals, "forward_seconds": sum(f["seconds"] for f in forwards),
            "rows_seconds": outside["hf.rows"], "plan_seconds": outside["hf.plan"]}


def format_profile(profile: dict[str, Any], title: str) -> str:
    """The totals by part with their shares, then one line per forward."""
    total = profile["forward_seconds"] or 1.0
    lines = [f"#### {title}: where hf's forwards spent {profile['forward_seconds']:.2f} s (profiler time; rows "
             f"{profile['rows_seconds']:.2f} s and planning {profile['plan_seconds']:.2f} s outside them)", "",
             "| part | s | share |", "| --- | ---: | ---: |"]
    lines += [f"| {part} | {profile['totals'][part]:.2f} | {profile['totals'][part] / total:.1%} |" for part in PARTS]
    lines += ["", "| rows | prefix | fed | s | " + " | ".join(PARTS) + " |",
              "| ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in PARTS) + " |"]
    for f in profile["forwards"]:
        lines.append(f"| {f['rows']} | {f['prefix']} | {f['fed']} | {f['seconds']:.2f} | "
                     + " | ".join(f"{f[part]:.2f}" for part in PARTS) + " |")
    return "\n".join(lines)
