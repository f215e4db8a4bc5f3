#!/usr/bin/env bash
# The whole suite three times in a row on a clean clone of HEAD, as CI runs it (CI=true, scripts/test.sh),
# and a failure on any difference in outcome between the runs: a test that passed once and failed or
# skipped another time depends on timing, scheduling or state another test left. Also fails when a run is
# red. Each run's JUnit XML, log and wall time are kept in the work folder it prints.
#   RACE_FLAKE_RUNS=N    runs (default 3)
#   RACE_FLAKE_DIR=path  work folder (default: a new one under /tmp)
# Extra arguments go to pytest (e.g. tests/test_cover.py to check one file).
set -uo pipefail
RUNS=${RACE_FLAKE_RUNS:-3}
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=${RACE_FLAKE_DIR:-$(mktemp -d /tmp/race-flake-XXXXXX)}
mkdir -p "$WORK"
git clone -q "$SRC" "$WORK/repo" || { echo "flake_check: could not clone $SRC" >&2; exit 2; }
cd "$WORK/repo" || exit 2
echo "flake_check: $RUNS runs of the suite at $(git rev-parse --short HEAD) in $WORK/repo" >&2
status=0
for i in $(seq 1 "$RUNS"); do
  start=$(date +%s)
  CI=true bash scripts/test.sh --junitxml="$WORK/run-$i.xml" "$@" >"$WORK/run-$i.log" 2>&1
  rc=$?
  echo "flake_check: run $i: exit $rc in $(( ($(date +%s) - start) / 60 )) min ($(tail -n 1 "$WORK/run-$i.log"))" >&2
  [ "$rc" = 0 ] || status=1
done
python3 - "$WORK" "$RUNS" <<'PY' || status=1
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

work, runs = Path(sys.argv[1]), int(sys.argv[2])


def outcomes(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    found = {}
    for case in ET.parse(path).iter("testcase"):
        kind = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        found[f"{case.get('classname')}::{case.get('name')}"] = kind
    return found


results = [outcomes(work / f"run-{i}.xml") for i in range(1, runs + 1)]
tests = sorted(set().union(*results))
differ = [t for t in tests if len({r.get(t, "missing") for r in results}) > 1]
print(f"flake_check: {len(tests)} tests, outcomes per run: "
      + "; ".join(", ".join(f"{k} {list(r.values()).count(k)}" for k in ("passed", "failure", "error", "skipped")
                            if k in r.values()) for r in results), file=sys.stderr)
for t in differ:
    print(f"flake_check: DIFFERS {t}: " + " / ".join(r.get(t, "missing") for r in results), file=sys.stderr)
sys.exit(1 if differ or not tests else 0)
PY
[ "$status" = 0 ] && echo "flake_check: $RUNS identical green runs" >&2 || echo "flake_check: FAILED (see above; logs in $WORK)" >&2
exit "$status"
