"""The Prefect flows and the `race` command line.

Prefect reads its settings from the environment once, when it is imported, and every module of this
package imports it: the defaults the command line promises (telemetry off, a temporary server that
may take up to 180 s to start on a slow or loaded machine instead of Prefect's 20) are set here,
before any of them, unless the user set them.
"""

import os

PREFECT_DEFAULTS = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}
for _name, _value in PREFECT_DEFAULTS.items():
    os.environ.setdefault(_name, _value)
