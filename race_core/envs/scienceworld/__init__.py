"""ScienceWorld, the paper's first environment (extra `race-pipeline[scienceworld]`, a Java runtime).
`world`: `--env scienceworld` (its simulators: `simulator`), declared as a plug-in is (the entry point group `race.environments` in
pyproject.toml), so the stages that play it key on its own source and scienceworld's version, and the
keys of the stages that play race's other environments do not change with it."""
