#!/bin/sh
# The rest of a new user's first hour, run for real on `make run` (issue 29), after docs/walkthrough-workload.sh:
# the command-line client, a webhook receiving a lease's events (signed), a workload's port through the interactive
# proxy, a shell beside it over SSH with one's own key, and auto-tiering (`kind: auto`: profile first, then the
# chosen slice). Every address comes from the service's own answers (the lease's `access`), so the script holds for
# any `make run PORT=…`. tests/test_run_first_hour.py runs it against `make run`.
#
#   make run                              # in another terminal
#   sh docs/walkthrough-first-hour.sh
#
# Settings: BASE_URL (http://127.0.0.1:8000), PYTHON (.venv/bin/python), WAIT_SECONDS (a step's longest wait, 300:
# a profiling run's leases), WORK (a scratch directory, made if unset).
set -eu

cd "$(dirname "$0")/.."
BASE_URL=${BASE_URL:-http://127.0.0.1:8000}
PYTHON=${PYTHON:-.venv/bin/python}
GPUBROKER=${GPUBROKER:-$(dirname "$PYTHON")/gpubroker}
WAIT_SECONDS=${WAIT_SECONDS:-300}
WORK=${WORK:-$(mktemp -d)}
RECEIVER_PID=""
LEASE=""

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
api() {  # api METHOD PATH [BODY]: the answer's body, then its status on the last line
    curl -s -w '\n%{http_code}' -X "$1" -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" \
         ${3:+-d "$3"} "$BASE_URL/api/v1$2"
}
body() { printf '%s' "$1" | sed '$d'; }
status() { printf '%s' "$1" | tail -n 1; }
wait_for() {  # wait_for WHAT COMMAND...: run COMMAND each second until it succeeds, at most WAIT_SECONDS
    what=$1; shift
    waited=0
    until "$@"; do
        [ "$waited" -lt "$WAIT_SECONDS" ] || fail "$what: not within $WAIT_SECONDS s"
        sleep 1
        waited=$((waited + 1))
    done
}
cleanup() {
    [ -z "$LEASE" ] || api DELETE "/leases/$LEASE" > /dev/null 2>&1 || true
    [ -z "$RECEIVER_PID" ] || kill "$RECEIVER_PID" 2> /dev/null || true
}
trap cleanup EXIT

curl -s -o /dev/null "$BASE_URL/healthz" || fail "nothing answers at $BASE_URL (start it with make run, or set BASE_URL)"

step "a token for scripts: manage.py tenant_bootstrap (acme, ada, an admin: she manages webhooks)"
TOKEN=$("$PYTHON" manage.py tenant_bootstrap --tenant acme --user ada --role admin)
[ -n "$TOKEN" ] || fail "tenant_bootstrap printed no token"

step "the command-line client: gpubroker quote and lease list (docs/cli.md), the token from the environment"
export GPUBROKER_URL="$BASE_URL" GPUBROKER_TOKEN="$TOKEN"
"$GPUBROKER" quote --project vision --gpu whole:A100-80GB --duration 600 || fail "gpubroker quote"
"$GPUBROKER" lease list || fail "gpubroker lease list"

step "a webhook receiver on this machine (make run allows loopback targets), and its endpoint (docs/notifications.md)"
"$PYTHON" - "$WORK" <<'PY' &
import http.server, json, pathlib, sys
work = pathlib.Path(sys.argv[1])

class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        with (work / "received.jsonl").open("a") as out:
            out.write(json.dumps({"signature": self.headers.get("Gpub-Signature", ""), "body": raw.decode()}) + "\n")
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
(work / "receiver.port").write_text(str(server.server_port))
server.serve_forever()
PY
RECEIVER_PID=$!
wait_for "the receiver listening" test -s "$WORK/receiver.port"
HOOK_URL="http://127.0.0.1:$(cat "$WORK/receiver.port")/hook"
ANSWER=$(api POST /webhooks "{\"url\": \"$HOOK_URL\", \"event_types\": [\"lease.active\", \"lease.released\"]}")
[ "$(status "$ANSWER")" = 201 ] || fail "POST /webhooks: $ANSWER"
SECRET=$(body "$ANSWER" | jget 'd["secret"]')
echo "endpoint $(body "$ANSWER" | jget 'd["id"]') → $HOOK_URL (its secret shown once, kept for verifying)"

step "a lease whose workload serves a page on its port (docs/leasing.md, \"Interactive access\")"
SERVER='import http.server, os
class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"hello from the lease")
http.server.ThreadingHTTPServer((os.environ["GPUB_LISTEN_HOST"], int(os.environ["PORT"])), Page).serve_forever()'
REQUEST=$("$PYTHON" -c 'import json, sys; print(json.dumps({"project": "vision", "gpu": {"kind": "whole",
    "model": "A100-80GB"}, "duration_seconds": 900, "workload": {"command": [sys.argv[1], "-c", sys.argv[2]],
    "port": 8888}}))' "$PYTHON" "$SERVER")
ANSWER=$(api POST /leases "$REQUEST")
[ "$(status "$ANSWER")" = 201 ] || fail "POST /leases: $ANSWER"
LEASE=$(body "$ANSWER" | jget 'd["id"]')
running() {
    DETAIL=$(body "$(api GET "/leases/$LEASE")")
    [ "$(printf '%s' "$DETAIL" | jget '(d.get("workload") or {}).get("state")')" = running ]
}
wait_for "lease $LEASE's workload running" running
URL=$(printf '%s' "$DETAIL" | jget 'd["access"][0]["interactive"]["url"]')
echo "interactive URL (access[0].interactive.url): $URL"
page() { [ "$(curl -s -H "Authorization: Bearer $TOKEN" "$URL")" = "hello from the lease" ]; }
wait_for "the workload's page through the proxy" page
curl -s -H "Authorization: Bearer $TOKEN" "$URL"; echo
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL")" = 401 ] || fail "the proxy answered without credentials"

step "SSH beside the workload with a key of one's own (docs/leasing.md, \"SSH\")"
ssh-keygen -q -t ed25519 -N "" -C "ada@walkthrough" -f "$WORK/id_ed25519"
KEY=$("$PYTHON" -c 'import json, sys; print(json.dumps({"name": "walkthrough", "public_key": open(sys.argv[1]).read()}))' \
      "$WORK/id_ed25519.pub")
ANSWER=$(api POST /ssh-keys "$KEY")
[ "$(status "$ANSWER")" = 201 ] || fail "POST /ssh-keys: $ANSWER"
SSH_COMMAND=$(printf '%s' "$DETAIL" | jget 'd["access"][0]["ssh"]["command"]')
echo "$SSH_COMMAND"
# the command as given, with this key and without touching ~/.ssh
SSH_OPTIONS="-i $WORK/id_ed25519 -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
# shellcheck disable=SC2086 # the command and the options are words
SHELL_SAYS=$(ssh $SSH_OPTIONS ${SSH_COMMAND#ssh } 'echo "on $(hostname) as uid $(id -u) with CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"') \
    || fail "ssh: $SSH_COMMAND"
echo "$SHELL_SAYS"
case $SHELL_SAYS in *CUDA_VISIBLE_DEVICES=?*) ;; *) fail "the shell does not see the lease's GPU";; esac

step "DELETE /api/v1/leases/$LEASE, then the webhook's deliveries: lease.active and lease.released, signed"
[ "$(status "$(api DELETE "/leases/$LEASE")")" = 202 ] || fail "DELETE /leases/$LEASE"
delivered() {
    [ -s "$WORK/received.jsonl" ] && "$PYTHON" - "$WORK/received.jsonl" "$LEASE" "$SECRET" <<'PY'
import hashlib, hmac, json, sys
seen = set()
for line in open(sys.argv[1]):
    hook = json.loads(line)
    event = json.loads(hook["body"])
    if event["data"]["lease"]["id"] != int(sys.argv[2]):
        continue
    pairs = [item.split("=", 1) for item in hook["signature"].split(",")]
    stamp = next(value for key, value in pairs if key == "t")
    expected = hmac.new(sys.argv[3].encode(), stamp.encode() + b"." + hook["body"].encode(), hashlib.sha256).hexdigest()
    if any(key == "v1" and hmac.compare_digest(value, expected) for key, value in pairs):
        seen.add(event["type"])
sys.exit(0 if {"lease.active", "lease.released"} <= seen else 1)
PY
}
wait_for "the webhook's deliveries for lease $LEASE" delivered
echo "lease.active and lease.released arrived at $HOOK_URL, each signature verified with the endpoint's secret"
LEASE=""

step "auto-tiering: a workload registered, then kind: auto (docs/tiering.md, §6)"
NAME="walk-bert-$(date +%s)"
ANSWER=$(api POST /workloads "{\"name\": \"$NAME\", \"architecture\": \"bert-base\", \"task\": \"inference\",
    \"precision\": \"fp16\", \"batch_size\": 8, \"seq_len\": 128, \"target_throughput\": 50}")
[ "$(status "$ANSWER")" = 201 ] || fail "POST /workloads: $ANSWER"
AUTO="{\"project\": \"vision\", \"gpu\": {\"kind\": \"auto\", \"workload\": \"$NAME\"}, \"duration_seconds\": 600}"
ANSWER=$(api POST /leases "$AUTO")
if [ "$(status "$ANSWER")" = 409 ]; then
    [ "$(body "$ANSWER" | jget 'd["code"]')" = profile_first ] || fail "kind: auto: $ANSWER"
    RUN=$(body "$ANSWER" | jget 'd["profiling_run"]')
    echo "409 profile_first: profiling run $RUN measures the workload on the fleet's slices first"
    profiled() {
        RUNS=$(body "$(api GET "/workloads/$NAME/profiling-runs")")
        [ "$(printf '%s' "$RUNS" | jget "[r['state'] for r in d['results'] if r['id'] == $RUN][0]")" != running ]
    }
    wait_for "profiling run $RUN finished" profiled
    printf '%s' "$RUNS" | jget "[f\"profiling run {r['id']} {r['state']}: \" + ', '.join(
        f\"{lease['slice_key']} {lease['outcome']}\" for lease in r['leases']) for r in d['results'] if r['id'] == $RUN][0]"
    ANSWER=$(api POST /leases "$AUTO")
fi
[ "$(status "$ANSWER")" = 201 ] || fail "kind: auto after profiling: $ANSWER"
LEASE=$(body "$ANSWER" | jget 'd["id"]')
body "$ANSWER" | jget 'd["decision"]'
[ "$(status "$(api DELETE "/leases/$LEASE")")" = 202 ] || fail "DELETE /leases/$LEASE"
LEASE=""

step "done: the client, a signed webhook, the interactive port, SSH and auto-tiering on $BASE_URL"
