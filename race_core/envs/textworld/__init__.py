"""TextWorld's games as environments (extra `race-pipeline[textworld]`). `cooking`: the cooking games,
`--env textworld-cooking`, declared as a plug-in is (the entry point group `race.environments` in
pyproject.toml), so the stages that play it key on its own source and textworld's version, and the keys
of the stages that play race's other environments do not change with it."""
