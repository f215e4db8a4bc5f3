"""Benchmarks (docs/architecture.md §1): workloads, baselines and the work bound. Not imported by the pipeline.

  workload.py   synthetic trajectories whose fields have exact token lengths; the models benchmarked
  baselines.py  the naive scorer, the work bound in tokens, the raw forward throughput
  scoring.py    every method's cover on one workload, decisions compared, the report
  memory.py     peak RSS of the real cover stage (`tasks.stages.cover`) for growing N
  report.py     the report as Markdown tables
  profile.py    one hf cover under torch.profiler: each forward's time by part (`--profile`)
  records.py    reports kept under bench/results/ with commit and machine; compare two; README tables
  cli.py        `race bench scoring|compare|table` (and `scripts/bench_scoring.py`)
"""
