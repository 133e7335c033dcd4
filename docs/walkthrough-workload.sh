#!/bin/sh
# The second walk-through, run for real: the workload example of docs/leasing.md ("Workloads") as written there,
# from the preview to its logs. The request body is read from docs/leasing.md itself, so the page and this run
# cannot drift apart (tests/test_walkthrough_workload.py runs it against a live service).
#
#   make run                              # in another terminal: the service, the demo and its simulated fleet
#   sh docs/walkthrough-workload.sh       # the documented paths under /srv/gpubroker, as make run sets them up
#
# make run gives its nodes and the broker one workload root, /srv/gpubroker (var/workloads where that cannot be
# written: its banner says which), and puts the demo's train.py in /srv/gpubroker/acme/vision. Settings:
# BASE_URL (http://127.0.0.1:8000), WORKLOAD_ROOT (the root make run chose, if not /srv/gpubroker), WAIT_SECONDS (60).
set -eu

cd "$(dirname "$0")/.."
BASE_URL=${BASE_URL:-http://127.0.0.1:8000}
WORKLOAD_ROOT=${WORKLOAD_ROOT:-/srv/gpubroker}
WAIT_SECONDS=${WAIT_SECONDS:-60}
PYTHON=${PYTHON:-.venv/bin/python}

step() { printf '\n== %s\n' "$*"; }
fail() { printf 'walkthrough failed: %s\n' "$*" >&2; exit 1; }
jget() {
    "$PYTHON" -c '
import json, sys
text = sys.stdin.read()
try:
    value = eval(sys.argv[1], {"d": json.loads(text)})
except (ValueError, LookupError, TypeError) as error:
    sys.exit(f"walkthrough failed: no {sys.argv[1]} in the answer ({type(error).__name__}: {error}): {text[:800]}")
print(json.dumps(value) if isinstance(value, (dict, list)) else value)
' "$1"
}

curl -s -o /dev/null "$BASE_URL/healthz" || fail "nothing answers at $BASE_URL (start it with make run, or set BASE_URL)"

step "a token for scripts: manage.py tenant_bootstrap (acme, adam, a member)"
TOKEN=$("$PYTHON" manage.py tenant_bootstrap --tenant acme --user adam --role member)
[ -n "$TOKEN" ] || fail "tenant_bootstrap printed no token"

step "the documented request (docs/leasing.md, \"Workloads\"), its paths under $WORKLOAD_ROOT"
BODY=$("$PYTHON" - "$WORKLOAD_ROOT" <<'PY'
import json, re, sys
text = open("docs/leasing.md").read()
block = re.search(r"```json\nPOST /api/v1/leases\n(\{.*?\"workload\".*?)\n```", text, re.S).group(1)
body = json.loads(block)
print(json.dumps(body).replace("/srv/gpubroker/", sys.argv[1].rstrip("/") + "/"))
PY
)
printf '%s\n' "$BODY"

step "POST /api/v1/quotes: the preview checks the paths against the nodes' own roots"
QUOTE=$(curl -s -X POST -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" -d "$BODY" \
     "$BASE_URL/api/v1/quotes")
printf '%s\n' "$QUOTE"
OUTCOME=$(printf '%s' "$QUOTE" | jget 'd.get("outcome") or "refused: " + d.get("detail", "")')
case $OUTCOME in fits|reclaims|waits) ;; *) fail "the preview refused the documented request: $OUTCOME";; esac

step "POST /api/v1/leases with the documented request"
ANSWER=$(curl -s -X POST -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" -d "$BODY" \
     "$BASE_URL/api/v1/leases")
printf '%s\n' "$ANSWER"
LEASE=$(printf '%s' "$ANSWER" | jget 'd["id"]')

step "GET /api/v1/leases/$LEASE until its workload has run and the lease ended (at most ${WAIT_SECONDS} s)"
waited=0
while :; do
    LEASE_JSON=$(curl -s -H "Authorization: Bearer $TOKEN" "$BASE_URL/api/v1/leases/$LEASE")
    state=$(printf '%s' "$LEASE_JSON" | jget 'd["state"]')
    case $state in released|expired|failed) break;; esac
    [ "$waited" -lt "$WAIT_SECONDS" ] || fail "lease $LEASE is still $state after $WAIT_SECONDS s (reason:" \
        "$(printf '%s' "$LEASE_JSON" | jget 'd["reason"]')). Are the Celery worker and the simulated fleet running?"
    sleep 1
    waited=$((waited + 1))
done
reason=$(printf '%s' "$LEASE_JSON" | jget 'd["reason"]')
echo "lease $LEASE ended ($state): $reason"
[ "$state" = released ] || fail "lease $LEASE ended $state: $reason"

step "GET /api/v1/leases/$LEASE/logs"
LOGS=$(curl -s -H "Authorization: Bearer $TOKEN" "$BASE_URL/api/v1/leases/$LEASE/logs")
printf '%s\n' "$LOGS" | jget 'd["data"]'
case $(printf '%s' "$LOGS" | jget 'd["data"]') in
    *"training finished"*) ;;
    *) fail "the workload's log does not end its training";;
esac

step "done: the documented workload ran on $BASE_URL and its logs are there"
