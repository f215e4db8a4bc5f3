"""The benchmark's report as Markdown tables."""

from __future__ import annotations

from typing import Any


def format_comparison(comparison: dict[str, Any]) -> str:
    """`naive (2 trajectories, 2 candidates), ... vs hf`: what each method was compared on."""
    parts = [f"{c['method']} ({c['trajectories']} trajectories, {c['candidates']} candidates)"
             for c in comparison["methods"]]
    return f"{', '.join(parts)} vs {comparison['reference']}"


def _times(ratio: float | None, digits: int = 2) -> str:
    """A ratio as `3.1x`, or n/a (a method that did not run: naive with --no-naive)."""
    return "n/a" if ratio is None else f"{ratio:.{digits}f}x"


def format_table(run: dict[str, Any]) -> str:
    bound = run["bound"]
    lines = [f"### model {run['model']} ({run['parameters'] / 1e6:.1f}M params), N={run['N']}, T={run['T']}, "
             f"hf batch {run['batch_size']}: {run['candidates']} candidates, {run['accepted_removals']} accepted",
             "",
             "| method | wall s | tokens processed | tokens/s | speed-up vs naive | time vs bound "
             "| vs bound + attention | CPU s | speed-up vs naive (CPU) | CPU vs bound |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for m in run["methods"]:
        name = m["name"] + (f" (measured on {m['measured_on']}, scaled)" if m["measured_on"] < run["N"] else "")
        cpu = (f"{m['cpu_s']:.2f} | {_times(m['speedup_vs_naive_cpu'], 1)} | {m['cpu_vs_bound']:.2f}x"
               if m["cpu_s"] is not None else "n/a | n/a | n/a")
        lines.append(f"| {name} | {m['wall_s']:.2f} | {m['tokens_processed']:,} | {m['tokens_per_s']:,.0f} | "
                     f"{_times(m['speedup_vs_naive'], 1)} | {m['time_vs_bound']:.2f}x | "
                     f"{_times(m.get('time_vs_attention_bound'))} | {cpu} |")
    lines.append(f"| work bound | {bound['wall_s']:.2f} | {bound['tokens']:,} | {bound['forward_tokens_per_s']:,.0f} "
                 f"(raw forward) | | 1.00x | {_attention_bound_ratio(bound)} | {bound['cpu_s']:.2f} | | 1.00x |")
    lines += ["", format_work(run), "", head_note(run), attention_note(run)]
    lines.append(f"decisions identical across methods: {run['decisions_identical']} "
                 f"({format_comparison(run['decisions_compared'])})")
    lines.append("CPU s = this process's CPU time over all threads: unlike wall time it is not inflated by "
                 "other jobs on a shared machine")
    lines.extend(run["notes"])
    lines.extend(f"{m['name']}: {m['note']}" for m in run["methods"] if m.get("note"))
    return "\n".join(lines)


def format_work(run: dict[str, Any]) -> str:
    """Each method's work counters (on the trajectories it ran: a scaled method's are its subset's)."""
    lines = ["| method (work counters) | forwards | model calls | rows | tokens fed | padded positions | padded / fed "
             "| attention pairs | KV bytes copied | evictions |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for m in run["methods"]:
        w = m.get("work") or {}
        if not w:
            continue
        fed = w["tokens_processed"]
        padded = f"{w['padded_positions'] / fed:.3f}" if fed and w["padded_positions"] else "n/a"
        name = m["name"] + (f" (on {m['measured_on']})" if m["measured_on"] < run["N"] else "")
        lines.append(f"| {name} | {w['forward_calls']:,} | {w['decoder_calls']:,} | {w['rows']:,} | {fed:,} | "
                     f"{w['padded_positions']:,} | {padded} | {w['attention_pairs']:,} | {w['kv_bytes_copied']:,} | "
                     f"{w['evictions']:,} |")
    return "\n".join(lines)


def format_real_table(run: dict[str, Any]) -> str:
    """The real-model run (`--checkpoint`, `--input`): every method, early rejection included, with its
    ratios to the work bound and its decision mix."""
    bound = run["bound"]
    lines = [f"### model {run['model']} ({run['parameters'] / 1e6:.1f}M params, {run['device']} {run['dtype']}) on "
             f"{run['input']}: N={run['N']}, T={run['T']}, {run['tokens']:,} tokens, epsilon {run['epsilon']:g}, "
             f"hf batch {run['batch_size']}" + (f", fastest of {run['repeats']} runs" if run["repeats"] > 1 else ""),
             "",
             "| method | wall s | tokens processed | tokens vs bound | time vs bound | vs bound + attention | CPU s "
             "| CPU vs bound | speed-up vs naive | accepted / candidates |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for m in run["methods"]:
        scaled = m["measured_on"] < run["N"]
        name = m["name"] + (f" (measured on {m['measured_on']}, scaled)" if scaled else "")
        cpu = f"{m['cpu_s']:.2f} | {m['cpu_vs_bound']:.2f}x" if m["cpu_s"] is not None else "n/a | n/a"
        mix = f"{m['accepted_removals']} / {m['candidates']}" + (f" (on {m['measured_on']})" if scaled else "")
        lines.append(f"| {name} | {m['wall_s']:.2f} | {m['tokens_processed']:,} | {m['tokens_vs_bound']:.2f}x | "
                     f"{m['time_vs_bound']:.2f}x | {_times(m.get('time_vs_attention_bound'))} | {cpu} | "
                     f"{_times(m['speedup_vs_naive'], 1)} | {mix} |")
    lines.append(f"| work bound | {bound['wall_s']:.2f} | {bound['tokens']:,} | 1.00x | 1.00x | "
                 f"{_attention_bound_ratio(bound)} | {bound['cpu_s']:.2f} | 1.00x | | |")
    lines += ["", format_work(run), ""]
    lines.append(f"work bound: {bound['tokens']:,} tokens at the raw forward's {bound['forward_tokens_per_s']:,.0f} "
                 f"tokens/s ({bound['forward_tokens_per_cpu_s']:,.0f} per CPU s; {bound['throughput_rows']} rows "
                 f"in one batch), the fastest of the raw forwards timed just before each method; every ratio uses it")
    lines += [head_note(run), attention_note(run)]
    lines.append(f"decisions identical across methods: {run['decisions_identical']} "
                 f"({format_comparison(run['decisions_compared'])}); scorer noise {run['scorer_noise']:.2e}")
    if run["rejects"]:
        lines.append(f"{run['rejects']} input line(s)/trajectories rejected, not scored; first: " + "; ".join(
            f"{r['file']}:{r['line']} [{r['code']}] {r['field']}: {r['message']}" for r in run["first_rejects"]))
    lines.extend(run["notes"])
    lines.extend(f"{m['name']}: {m['note']}" for m in run["methods"] if m.get("note"))
    return "\n".join(lines)


def head_note(run: dict[str, Any]) -> str:
    """What the bound leaves out: the head over the action tokens the cover scores (older records
    did not measure it)."""
    bound = run["bound"]
    if "head_wall_s" not in bound:
        return "the head's time was not measured in this record"
    ratios = ", ".join(f"{m['name']} {m['time_vs_bound_with_head']:.2f}x" for m in run["methods"])
    return (f"the bound times the decoder alone; the head over the {bound['head_targets']:,} action tokens the cover "
            f"scores takes {bound['head_wall_s']:.2f} s more at the raw head's {bound['head_tokens_per_s']:,.0f} "
            f"tokens/s: against the bound with the head, {ratios}")


def _attention_bound_ratio(bound: dict[str, Any]) -> str:
    attention = bound.get("attention")
    return f"{bound['wall_s'] / attention['wall_s']:.2f}x" if attention else "n/a"


def attention_note(run: dict[str, Any]) -> str:
    """What the bound with attention adds (`bench.scoring.attention_bound`; older records lack it)."""
    attention = run["bound"].get("attention")
    if not attention:
        return "the bound with attention was not measured in this record"
    shapes = ", ".join(f"{rows} x {length}" for rows, length in attention["shapes"])
    return (f"the bound with attention: the bound's {run['bound']['tokens']:,} tokens attend over "
            f"{attention['pairs']:,} (query, key) pairs ({attention['pairs_per_token']:,.0f} per token), priced by "
            f"raw forwards of {shapes} at {attention['per_token_s'] * 1e6:.1f} µs a position and "
            f"{attention['per_pair_s'] * 1e9:.2f} ns a pair: {attention['wall_s']:.2f} s, attention "
            f"{attention['attention_share']:.0%} of it")


def format_demo(demo: dict[str, Any]) -> str:
    full, early = demo["hf"], demo["hf+early-reject"]
    return (f"### early rejection on {demo['data']} (tiny model): {demo['candidates']} candidates, "
            f"{demo['accepted_removals']} accepted\n\n"
            "| method | wall s | CPU s | tokens processed | tokens vs bound |\n| --- | ---: | ---: | ---: | ---: |\n"
            f"| hf | {full['wall_s']:.2f} | {full['cpu_s']:.2f} | {full['tokens_processed']:,} | "
            f"{full['tokens_processed'] / demo['bound_tokens']:.2f}x |\n"
            f"| hf+early-reject | {early['wall_s']:.2f} | {early['cpu_s']:.2f} | {early['tokens_processed']:,} | "
            f"{early['tokens_processed'] / demo['bound_tokens']:.2f}x |\n\n"
            f"bound tokens {demo['bound_tokens']:,}; decisions identical: {demo['decisions_identical']} "
            f"({format_comparison(demo['decisions_compared'])})")


