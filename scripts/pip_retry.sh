# Sourced by scripts/setup.sh; needs PIP (an array: the venv's python -m pip and its options).
#   RACE_PIP_ATTEMPTS  installs to try when the network fails them (default 4)
#   RACE_PIP_PAUSE     seconds to wait before the second try, twice that before the third... (default 30)
# The package registry drops connections mid-download now and then (a 286 MB wheel stalled at the
# same byte six times in a row): pip retries harder within a call, and an install whose output names
# a network failure is run again after a pause. Any other failure fails at once.
export PIP_RETRIES="${PIP_RETRIES:-10}" PIP_RESUME_RETRIES="${PIP_RESUME_RETRIES:-20}" PIP_TIMEOUT="${PIP_TIMEOUT:-60}"
ATTEMPTS=${RACE_PIP_ATTEMPTS:-4}
PAUSE=${RACE_PIP_PAUSE:-30}  # seconds before the second attempt; doubled, tripled after
NETWORK_ERROR='incomplete-download|Connection (interrupted|reset|aborted|refused)|ConnectionError|ReadTimeout|timed out|Temporary failure in name resolution|HTTPSConnectionPool|ProtocolError|IncompleteRead|network connectivity'

pip_quiet() {
  # pip with its "is ignored" notices hidden; pip's status, retried on network failures only
  local attempt out status
  for ((attempt = 1; attempt <= ATTEMPTS; attempt++)); do
    status=0
    out=$("${PIP[@]}" "$@" 2>&1) || status=$?
    printf '%s\n' "$out" | { grep -v "is ignored" | grep -v '^$' || true; }
    [ "$status" -eq 0 ] && return 0
    if [ "$attempt" -lt "$ATTEMPTS" ] && printf '%s' "$out" | grep -qE "$NETWORK_ERROR"; then
      echo "pip install failed on the network (attempt $attempt of $ATTEMPTS); trying again in $((attempt * PAUSE)) s" >&2
      sleep $((attempt * PAUSE))
    else
      return "$status"
    fi
  done
  return "$status"
}
