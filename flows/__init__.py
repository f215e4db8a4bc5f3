"""The Prefect flows and the `race` command line.

Prefect reads its settings from the environment once, when it is imported, and every module of this
package imports it: the defaults the command line promises (telemetry off, a temporary server that
may take up to 180 s to start on a slow or loaded machine instead of Prefect's 20) are set here,
before any of them, unless the user set them.

Log lines: every module of the project logs to `logging.getLogger(__name__)`. Prefect sends the
records of the package loggers `LOGGERS` to the API (its "extra loggers" get its `api` handler, and
a record logged inside a task run or flow run is filed under that run; outside one it is dropped
without a warning), and its console handler on the root logger prints them. Those loggers are set
to INFO here (unless set already), in every process that imports a flow: the `race` command, and
the child processes in which a worker or `race serve` runs a flow run. The commands that run no
flow print the lines on stderr as plain messages instead (`flows.cli.main`).
"""

import logging
import os

LOGGERS = ("race_core", "tasks", "flows", "storage", "report", "bench")  # the project's packages

PREFECT_DEFAULTS = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
                    "PREFECT_LOGGING_EXTRA_LOGGERS": ",".join(LOGGERS),
                    "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore"}
for _name, _value in PREFECT_DEFAULTS.items():
    os.environ.setdefault(_name, _value)
for _name in LOGGERS:
    if logging.getLogger(_name).level == logging.NOTSET:
        logging.getLogger(_name).setLevel(logging.INFO)
