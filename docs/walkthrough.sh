#!/bin/sh
# The walk-through, run for real: a token, quotas, a problem+json answer, a MIG slice from request to
# release, usage, a draft invoice and its PDF (docs/tour.md, "The walk-through"; README.md's one example is
# its lease part). Every command those pages show is here word for word, and every curl or manage.py call
# here is in docs/tour.md (tests/test_readme_walkthrough.py checks both); the lines around them only check
# the answers and wait.
#
#   make run                    # in another terminal: the service, its demo tenants and a simulated fleet
#   sh docs/walkthrough.sh      # BASE_URL=http://127.0.0.1:8010 sh docs/walkthrough.sh after make run PORT=8010
#
# Needs curl and the project's .venv (its Python reads the JSON answers; jq is not needed). manage.py
# finds the database of the running `make run` through var/runtime.env (DATABASE_URL, when set, wins).
# Settings: BASE_URL (http://127.0.0.1:8000), OUT_DIR for invoice.pdf (var), WAIT_SECONDS (60).
set -eu

cd "$(dirname "$0")/.."
BASE_URL=${BASE_URL:-http://127.0.0.1:8000}
OUT_DIR=${OUT_DIR:-var}
WAIT_SECONDS=${WAIT_SECONDS:-60}

step() { printf '\n== %s\n' "$*"; }
fail() { printf 'walkthrough failed: %s\n' "$*" >&2; exit 1; }
# jget EXPR: the Python expression EXPR over the JSON answer on stdin (named d), printed; exits 1 naming
# EXPR and showing the answer when the answer is no JSON or lacks it
jget() {
    .venv/bin/python -c '
import json, sys
text = sys.stdin.read()
try:
    value = eval(sys.argv[1], {"d": json.loads(text)})
except (ValueError, LookupError, TypeError, StopIteration) as error:
    sys.exit(f"walkthrough failed: no {sys.argv[1]} in the answer ({type(error).__name__}: {error}): {text[:800]}")
print(json.dumps(value) if isinstance(value, (dict, list)) else value)
' "$1"
}
# expect ANSWER EXPR WHAT: fail with WHAT and the answer unless EXPR holds for the JSON ANSWER
expect() {
    [ "$(printf '%s' "$1" | jget "$2")" = True ] || fail "$3; the answer was: $1"
}
# wait_state STATE: poll lease $LEASE until it is in STATE, at most WAIT_SECONDS; its last answer in LEASE_JSON
wait_state() {
    waited=0
    while :; do
        LEASE_JSON=$(curl -s -H "Authorization: Bearer $TOKEN" "$BASE_URL/api/v1/leases/$LEASE")
        state=$(printf '%s' "$LEASE_JSON" | jget 'd["state"]')
        [ "$state" = "$1" ] && return 0
        reason=$(printf '%s' "$LEASE_JSON" | jget 'd["reason"]')
        case $state in
            released|expired|failed) fail "lease $LEASE ended $state while waiting for $1 (reason: $reason)";;
        esac
        [ "$waited" -lt "$WAIT_SECONDS" ] || fail "lease $LEASE is still $state after $WAIT_SECONDS s, not $1" \
            "(reason: $reason). Are the Celery worker and the simulated fleet running? make run starts both."
        sleep 1
        waited=$((waited + 1))
    done
}

curl -s -o /dev/null "$BASE_URL/healthz" || fail "nothing answers at $BASE_URL (start it with make run, or set BASE_URL)"

step "a token for scripts: manage.py tenant_bootstrap (acme, alice)"
TOKEN=$(.venv/bin/python manage.py tenant_bootstrap --tenant acme --user alice)
[ -n "$TOKEN" ] || fail "tenant_bootstrap printed no token"

step "GET /api/v1/quotas"
QUOTAS=$(curl -s -H "Authorization: Bearer $TOKEN" "$BASE_URL/api/v1/quotas")
printf '%s\n' "$QUOTAS"
expect "$QUOTAS" 'len(d["tenant"]) > 0 and len(d["projects"]) > 0' \
    "the quotas answer lists no tenant or project quotas (make run seeds them: manage.py seed_demo)"

step "POST /api/v1/projects without a name: a 400 problem+json naming the field"
PROBLEM=$(curl -s -X POST -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" \
     -d '{"slug": "speech"}' "$BASE_URL/api/v1/projects")
printf '%s\n' "$PROBLEM"
expect "$PROBLEM" 'd["status"] == 400 and d["field"] == "name"' "expected a 400 problem naming the field name"

step "POST /api/v1/leases: a 3g.40gb MIG slice for project vision, with an Idempotency-Key"
KEY="train-$(date +%s)"
ANSWER=$(curl -s -X POST -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" \
     -H "Idempotency-Key: $KEY" \
     -d '{"project": "vision", "gpu": {"kind": "mig", "profile": "3g.40gb"}, "duration_seconds": 3600}' \
     "$BASE_URL/api/v1/leases")
printf '%s\n' "$ANSWER"
LEASE=$(printf '%s' "$ANSWER" | .venv/bin/python -c 'import json, sys; print(json.load(sys.stdin)["id"])')
echo "lease id: $LEASE"

step "GET /api/v1/leases/$LEASE until it is active (at most ${WAIT_SECONDS} s)"
wait_state active
printf '%s\n' "$LEASE_JSON"
echo "lease $LEASE is active on $(printf '%s' "$LEASE_JSON" | jget 'd["devices"][0]["node"]'):" \
     "$(printf '%s' "$LEASE_JSON" | jget 'd["devices"][0]["mig_profile"]')" \
     "$(printf '%s' "$LEASE_JSON" | jget 'd["devices"][0]["device_uuid"]')"

step "DELETE /api/v1/leases/$LEASE, then wait until it is released"
RELEASE=$(curl -s -X DELETE -H "Authorization: Bearer $TOKEN" "$BASE_URL/api/v1/leases/$LEASE")
printf '%s\n' "$RELEASE"
wait_state released
echo "lease $LEASE is released"

MONTH=$(date -u +%Y-%m)
step "invoice_run --period $MONTH --draft --through-now (meters the hour in progress, then builds the draft)"
RUN=$(.venv/bin/python manage.py invoice_run --period "$MONTH" --draft --through-now)
printf '%s\n' "$RUN"
case $RUN in *" 0 tenant(s)"*) fail "invoice_run found no usage in $MONTH";; esac

step "GET /api/v1/usage for $MONTH by project"
USAGE=$(curl -s -H "Authorization: Bearer $TOKEN" "$BASE_URL/api/v1/usage?from=$MONTH-01&group_by=project")
printf '%s\n' "$USAGE"
expect "$USAGE" 'any(g["key"] == "vision" for g in d["groups"])' "the usage of $MONTH has no group for project vision"

step "GET /api/v1/invoices"
INVOICES=$(curl -s -H "Authorization: Bearer $TOKEN" "$BASE_URL/api/v1/invoices")
printf '%s\n' "$INVOICES"
INVOICE=$(printf '%s' "$INVOICES" | .venv/bin/python -c 'import json, sys; print(json.load(sys.stdin)["results"][0]["id"])')
expect "$INVOICES" "d['results'][0]['period'] == '$MONTH'" "the newest invoice is not the one of $MONTH"

step "GET /api/v1/invoices/$INVOICE.pdf into $OUT_DIR/invoice.pdf (curl -f: an error is never saved)"
mkdir -p "$OUT_DIR"
(cd "$OUT_DIR" && curl -sSf -o invoice.pdf -H "Authorization: Bearer $TOKEN" "$BASE_URL/api/v1/invoices/$INVOICE.pdf") \
    || fail "the PDF of invoice $INVOICE could not be downloaded"
IFS= read -r first_line < "$OUT_DIR/invoice.pdf" || true
case $first_line in
    %PDF*) echo "saved $OUT_DIR/invoice.pdf ($(wc -c < "$OUT_DIR/invoice.pdf" | tr -d ' ') bytes, a PDF)";;
    *) fail "$OUT_DIR/invoice.pdf does not start with %PDF";;
esac

step "done: every step of the walk-through worked against $BASE_URL"
