"""Benchmarks (DESIGN §1): workloads, baselines and the work bound. Not imported by the pipeline.

  workload.py   synthetic trajectories whose fields have exact token lengths; the models benchmarked
  baselines.py  the naive scorer, the work bound in tokens, the raw forward throughput
  scoring.py    every method's cover on one workload, decisions compared, the report
  memory.py     peak RSS of the real cover stage (`tasks.stages.cover`) for growing N
  report.py     the report as Markdown tables
  cli.py        `race bench scoring` (and `scripts/bench_scoring.py`)
"""
