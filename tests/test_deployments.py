"""The declared deployments (`deployments`) name flows that exist, and `flows.serve` makes of them the
Prefect deployments `race serve` serves: the manual one unscheduled, the nightly one on its cron and
serialized, the pool's child flow by module entrypoint. (Served against a real server: test_server.py.)"""

from prefect import Flow

from deployments import NIGHTLY_CRON, SERVE_DEFAULTS, declared, units_deployment
from flows.serve import flow_of, runner_deployment


def test_each_declaration_names_a_flow_and_becomes_the_deployment_race_serve_serves():
    manual, nightly = declared(SERVE_DEFAULTS)
    units = units_deployment("race-x")
    flows = {d.name: flow_of(d) for d in (manual, nightly, units)}
    assert all(isinstance(f, Flow) for f in flows.values())
    assert {n: f.name for n, f in flows.items()} == {"manual": "race-pipeline", "nightly": "race-nightly",
                                                     "race-x": "race-units"}
    served = runner_deployment(manual)
    assert served.name == "manual" and not served.schedules and served.concurrency_limit is None
    assert served.parameters["config"]["checkpoint"] == SERVE_DEFAULTS.checkpoint
    scheduled = runner_deployment(nightly)
    [schedule] = scheduled.schedules
    assert schedule.schedule.cron == NIGHTLY_CRON and schedule.schedule.timezone == "UTC"
    assert scheduled.concurrency_limit == 1 and scheduled.concurrency_options.collision_strategy == "ENQUEUE"
    assert set(scheduled.tags) == {"race", "nightly"} and scheduled.parameters["config"] == nightly.parameters["config"]
