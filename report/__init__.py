"""What a run leaves a reader: `report.markdown` (report.md and its plots, from a run's summary and
decisions) and `report.page` (report.html, the one-page explorer of a run, a sweep or an ablation,
with its assets in `report/assets/`). It reads race_core and storage and imports no stage, flow or
Prefect: the flows and the report stage call it."""
