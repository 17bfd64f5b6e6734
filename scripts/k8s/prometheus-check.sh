#!/usr/bin/env bash
# Scrapes a real ps-server and trainer with a real Prometheus, on 127.0.0.1 only, and checks that:
#   - `promtool check metrics` accepts every /metrics output (ps-server and trainer, mid-training);
#   - the project's series are ingested and increase (ps_rows_pulled_total, trainer_samples_total, ...);
#   - the PrometheusRule in k8s/base passes `promtool check rules` and its rules evaluate in Prometheus; the
#     replication and resharding alerts pass the unit test k8s/prometheus-rules-test.yaml (`promtool test rules`);
#   - every metric the Grafana dashboard and the alert rules use is declared in a metrics.rs file (serving's: in
#     serving/src/metrics.rs, or docs/serving.md until that crate exists; ps-serve itself is not run here), or in
#     the Metrics section of docs/replication.md (the replication contract; the names not yet in a metrics.rs are
#     listed). One server with no replicas runs here: the replication alerts evaluate live, none may fire.
# The ps-server is started as on Kubernetes: TOML config, shard index from the hostname (HOSTNAME=ps-0), and the
# trainer reaches it by DNS name (localhost:PORT). Installs Debian's prometheus (with promtool) when missing.
# Bounded: about a minute after the build (the trainer's input is a FIFO the check feeds until it is done). Env: CARGO_TARGET_DIR (honoured), PROM_CHECK_TIMEOUT (default 150 s).
set -euo pipefail

SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
HERE="$(cd "$SELF/../../k8s" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
TIMEOUT="${PROM_CHECK_TIMEOUT:-150}"
log() { echo "prometheus-check: $*" >&2; }
die() { log "FAILED: $*"; exit 1; }

# --- tools ---------------------------------------------------------------------------------------------------
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    log "installing Debian's prometheus (ships promtool)"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
for t in curl python3 prometheus promtool; do command -v "$t" >/dev/null || die "$t is not installed"; done

# --- build ---------------------------------------------------------------------------------------------------
log "building (cargo build --release -p ps-server -p trainer -p bench --bins)"
(cd "$ROOT" && cargo build --release --quiet -p ps-server -p trainer -p bench --bins)
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$TARGET" in /*) ;; *) TARGET="$ROOT/$TARGET" ;; esac
BIN="$TARGET/release"
start=$(date +%s)
deadline=$((start + TIMEOUT))

# --- processes, cleaned up on exit ---------------------------------------------------------------------------
WORK="$(mktemp -d)"
PIDS=()
cleanup() {
    local rc=$?
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [ "$rc" -ne 0 ]; then
        for f in "$WORK"/*.log; do [ -e "$f" ] && { echo "--- tail of $f" >&2; tail -n 15 "$f" >&2; }; done
    fi
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_ports() { # N free TCP/UDP ports on 127.0.0.1
    python3 - "$1" <<'PYEOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    while True:
        t = socket.socket(); t.bind(("127.0.0.1", 0)); port = t.getsockname()[1]
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            u.bind(("127.0.0.1", port))
        except OSError:
            t.close(); continue
        socks += [t, u]; print(port); break
PYEOF
}
mapfile -t PORTS < <(free_ports 4)
[ "${#PORTS[@]}" -eq 4 ] || die "could not find 4 free ports on 127.0.0.1"
PS_QUIC=${PORTS[0]} PS_METRICS=${PORTS[1]} TR_METRICS=${PORTS[2]} PROM_PORT=${PORTS[3]}
PROM="http://127.0.0.1:$PROM_PORT"

remaining() { echo $((deadline - $(date +%s))); }
TRAINER_PID=""
wait_for() { # description, command...: polls until the command succeeds; fails at once if the trainer died
    local what="$1"; shift
    until "$@" >/dev/null 2>&1; do
        [ -z "$TRAINER_PID" ] || trainer_alive
        [ "$(remaining)" -gt 0 ] || die "timed out waiting for $what"
        sleep 0.5
    done
}

log "data, certificates, config in $WORK"
"$BIN/gen-criteo" --rows 100000 --seed 1 --teacher-seed 7 --out "$WORK/train.tsv" >/dev/null 2>"$WORK/gen.log"
"$BIN/ps-server" certs init --tls-dir "$WORK/tls" >/dev/null
cat > "$WORK/ps-server.toml" <<TOML
listen = "127.0.0.1:$PS_QUIC"
metrics-listen = "127.0.0.1:$PS_METRICS"
data-dir = "$WORK/db"
tls-dir = "$WORK/tls"
num-shards = 1
flush-interval-secs = 2
TOML

HOSTNAME=ps-0 "$BIN/ps-server" --config "$WORK/ps-server.toml" --shard-index-from-hostname \
    >"$WORK/ps-server.log" 2>&1 &
PIDS+=($!)
wait_for "ps-server /readyz" curl -fsS "http://127.0.0.1:$PS_METRICS/readyz"
grep -q "shard index from hostname" "$WORK/ps-server.log" || die "ps-server did not log its shard index from the hostname"

cat > "$WORK/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ["$WORK/rules.yml"]
scrape_configs:
  - job_name: pstrain-ps
    static_configs: [{targets: ["127.0.0.1:$PS_METRICS"]}]
  - job_name: pstrain-trainer
    static_configs: [{targets: ["127.0.0.1:$TR_METRICS"]}]
YAML
# The alert rules exactly as deployed: the PrometheusRule's spec is a Prometheus rule file.
python3 - "$HERE/base/prometheusrule.yaml" "$WORK/rules.yml" <<'PYEOF'
import json, sys
try:
    import yaml
    doc = yaml.safe_load(open(sys.argv[1]))
except ImportError:  # no PyYAML: let promtool's own YAML parser read the spec (JSON is YAML)
    sys.exit("PyYAML is needed: pip install pyyaml (or run scripts/k8s/validate.sh first and use its venv)")
json.dump(doc["spec"], open(sys.argv[2], "w"), indent=1)
PYEOF
promtool check rules "$WORK/rules.yml" >&2 || die "promtool check rules refused k8s/base/prometheusrule.yaml"
# The replication alerts on synthetic series of replicated shards (k8s/prometheus-rules-test.yaml): the rules
# without their annotations, which the test does not restate.
mkdir "$WORK/unit"
python3 - "$WORK/rules.yml" "$WORK/unit/rules.yml" <<'PYEOF'
import json, sys
spec = json.load(open(sys.argv[1]))
for group in spec["groups"]:
    for rule in group["rules"]:
        rule.pop("annotations", None)
json.dump(spec, open(sys.argv[2], "w"), indent=1)
PYEOF
cp "$HERE/prometheus-rules-test.yaml" "$WORK/unit/"
promtool test rules "$WORK/unit/prometheus-rules-test.yaml" >&2 \
    || die "promtool test rules: k8s/prometheus-rules-test.yaml failed against k8s/base/prometheusrule.yaml"
promtool check config "$WORK/prometheus.yml" >/dev/null || die "promtool check config"

prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
    --web.listen-address="127.0.0.1:$PROM_PORT" --storage.tsdb.retention.time=1h \
    >"$WORK/prometheus.log" 2>&1 &
PIDS+=($!)
wait_for "prometheus /-/ready" curl -fsS "$PROM/-/ready"

# The trainer reads its training data from a FIFO that this check feeds, over and over, until it has seen what it
# needs: the trainer cannot finish (and take its series with it) while the check still queries them, however fast
# the machine is. Removing $WORK/feed-on ends the input at a line boundary; the trainer then ends its pass.
mkfifo "$WORK/train.fifo"
touch "$WORK/feed-on"
python3 - "$WORK/train.tsv" "$WORK/train.fifo" "$WORK/feed-on" >"$WORK/feeder.log" 2>&1 <<'PYEOF' &
import os, sys
data, fifo, flag = sys.argv[1:]
text = open(data, "rb").read()
chunks, start = [], 0
while start < len(text):  # ~1 MiB chunks that end at a line boundary
    end = text.find(b"\n", start + (1 << 20))
    end = len(text) if end < 0 else end + 1
    chunks.append(text[start:end])
    start = end
with open(fifo, "wb") as out:
    while os.path.exists(flag):
        for chunk in chunks:
            if not os.path.exists(flag):
                break
            out.write(chunk)
PYEOF
PIDS+=($!)
FEEDER_PID=$!
# The trainer finds the server by DNS name, as trainers do through the headless Service.
"$BIN/trainer" train --ps "localhost:$PS_QUIC" --tls-dir "$WORK/tls" --train "$WORK/train.fifo" \
    --metrics-listen "127.0.0.1:$TR_METRICS" --progress-secs 1 >"$WORK/trainer.log" 2>&1 &
PIDS+=($!)
TRAINER_PID=$!
trainer_alive() { kill -0 "$TRAINER_PID" 2>/dev/null || die "the trainer exited while the check still needed it (see its log)"; }
wait_for "trainer /metrics" curl -fsS "http://127.0.0.1:$TR_METRICS/metrics"

query() { # PromQL -> first sample's value, or empty
    curl -fsS --get "$PROM/api/v1/query" --data-urlencode "query=$1" | python3 -c '
import json, sys
r = json.load(sys.stdin)["data"]["result"]
print(r[0]["value"][1] if r else "")'
}
positive() { local v; v="$(query "$1")"; [ -n "$v" ] && python3 -c "import sys; sys.exit(0 if float('$v') > 0 else 1)"; }

# --- promtool check metrics on every endpoint, once histograms have observations --------------------------------
wait_for "trainer pull observations" positive 'sum(trainer_pull_duration_seconds_count)'
wait_for "trainer push observations" positive 'sum(trainer_push_duration_seconds_count)'
for ep in "ps-server http://127.0.0.1:$PS_METRICS/metrics" "trainer http://127.0.0.1:$TR_METRICS/metrics"; do
    set -- $ep
    curl -fsS "$2" > "$WORK/$1.metrics"
    if ! promtool check metrics < "$WORK/$1.metrics" > "$WORK/$1.promtool" 2>&1; then
        cat "$WORK/$1.promtool" >&2
        die "promtool check metrics refused the $1 output ($2)"
    fi
    log "promtool check metrics: $1 ok ($(grep -c '^# TYPE' "$WORK/$1.metrics") metric families)"
done

# --- series ingested and increasing ---------------------------------------------------------------------------
SERIES=(ps_rows_pulled_total ps_rows_pushed_total ps_requests_total trainer_samples_total trainer_batches_total
        trainer_wire_bytes_sent_total trainer_raw_bytes_received_total)
declare -A first
for s in "${SERIES[@]}"; do
    wait_for "$s in Prometheus" positive "sum($s)"
    first[$s]="$(query "sum($s)")"
done
for s in "${SERIES[@]}"; do
    wait_for "$s to increase past ${first[$s]}" positive "sum($s) - ${first[$s]}"
    log "$s: ${first[$s]} -> $(query "sum($s)")"
done
for q in 'up{job="pstrain-ps"}' 'up{job="pstrain-trainer"}'; do
    [ "$(query "$q")" = "1" ] || die "$q is not 1"
done
for q in 'histogram_quantile(0.99, sum by (le) (rate(trainer_pull_duration_seconds_bucket[10s])))' \
         'histogram_quantile(0.99, sum by (le) (rate(ps_request_duration_seconds_bucket{kind="pull"}[10s])))' \
         'sum(ps_rows_in_memory)' 'trainer_loss'; do
    wait_for "$q" positive "$q"
    log "$q = $(query "$q")"
done

# --- alert rules loaded and evaluated without errors ----------------------------------------------------------
rules_ok() {
    curl -fsS "$PROM/api/v1/rules" | python3 -c '
import json, sys
rules = [r for g in json.load(sys.stdin)["data"]["groups"] for r in g["rules"]]
bad = [(r["name"], r.get("lastError")) for r in rules if r.get("health") != "ok"]
sys.exit(0 if rules and not bad else 1)'
}
wait_for "alert rules to evaluate with health ok" rules_ok
# Latency alerts are left out: how fast this machine answers is not what a healthy run means here (a loaded or
# slow machine may hold one pending; its `for:` of 10 minutes keeps it from firing in this check anyway).
firing="$(curl -fsS "$PROM/api/v1/alerts" | python3 -c '
import json, sys
print(" ".join(a["labels"]["alertname"] for a in json.load(sys.stdin)["data"]["alerts"]
               if "Latency" not in a["labels"]["alertname"]))')"
[ -z "$firing" ] || die "alerts pending or firing on a healthy run: $firing"
log "$(grep -c 'alert:' "$HERE/base/prometheusrule.yaml") alert rules loaded, evaluated, none firing"

# --- names used by the dashboard and the rules are real metrics -------------------------------------------------
python3 - "$ROOT" "$HERE/grafana" "$HERE/base/prometheusrule.yaml" <<'PYEOF' || die "dashboard or rules use undeclared metrics"
import glob, json, os, re, sys
root, grafana, rules = sys.argv[1:]
declared = set()
for f in ("ps-server/src/metrics.rs", "trainer/src/metrics.rs", "serving/src/metrics.rs"):
    path = os.path.join(root, f)
    if not os.path.exists(path) and f.startswith("serving/"):
        # Before the serving crate exists, its names come from the contract's Metrics paragraph.
        path = os.path.join(root, "docs/serving.md")
        print(f"prometheus-check: {f} absent: serving_* names from docs/serving.md", file=sys.stderr)
    declared |= set(re.findall(r'(?:"|`)((?:ps|trainer|serving)_[a-z0-9_]+)', open(path).read()))
in_code = set(declared)
# The replication contract's metric names (docs/replication.md, section Metrics): the servers are to export them.
text = open(os.path.join(root, "docs/replication.md")).read()
section = re.search(r"^## Metrics.*?(?=^## |\Z)", text, re.M | re.S)
declared |= set(re.findall(r"`((?:ps|trainer)_[a-z0-9_]+)`", section.group(0) if section else ""))
def names(text):
    found = set()
    for n in re.findall(r"\b((?:ps|trainer|serving)_[a-z0-9_]+)", text):
        for suffix in ("_bucket", "_count", "_sum"):
            if n.endswith(suffix) and n[: -len(suffix)] in declared:
                n = n[: -len(suffix)]
        found.add(n)
    return found
exprs = []
for path in glob.glob(os.path.join(grafana, "*.json")):
    def walk(o):
        if isinstance(o, dict):
            for k, v in o.items():
                if k == "expr": exprs.append((path, v))
                else: walk(v)
        elif isinstance(o, list):
            for v in o: walk(v)
    walk(json.load(open(path)))
exprs.append((rules, open(rules).read()))
bad = sorted({(os.path.basename(p), n) for p, e in exprs for n in names(e) if n not in declared})
for p, n in bad:
    print(f"prometheus-check: {p} uses {n}, which no metrics.rs (nor docs/replication.md) declares", file=sys.stderr)
used = {n for _, e in exprs for n in names(e)}
print(f"prometheus-check: dashboard and rules use {len(used)} metric names, all declared", file=sys.stderr)
contract_only = sorted((used & declared) - in_code)
if contract_only:
    print(f"prometheus-check: {len(contract_only)} of them only in docs/replication.md, no metrics.rs yet: "
          + " ".join(contract_only), file=sys.stderr)
sys.exit(1 if bad else 0)
PYEOF

# Every dashboard query parses and runs in this Prometheus ($__rate_interval -> 10s).
python3 - "$PROM" "$HERE/grafana" <<'PYEOF' || die "a dashboard query failed in Prometheus"
import glob, json, sys, urllib.parse, urllib.request
prom, grafana = sys.argv[1:]
n = empty = 0
for path in glob.glob(grafana + "/*.json"):
    for panel in json.load(open(path))["panels"]:
        for t in panel.get("targets", []):
            expr = t["expr"].replace("$__rate_interval", "10s")
            url = prom + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
            try:
                r = json.load(urllib.request.urlopen(url, timeout=10))
            except Exception as e:
                sys.exit(f"prometheus-check: panel {panel['title']!r}: {expr}: {e}")
            n += 1
            empty += not r["data"]["result"]
print(f"prometheus-check: {n} dashboard queries run in Prometheus ({empty} empty so far, e.g. eval metrics)", file=sys.stderr)
PYEOF

# Everything is checked: end the input; the trainer must finish its pass and exit 0 by itself.
trainer_alive
rm -f "$WORK/feed-on"
wait "$FEEDER_PID" || die "the FIFO feeder failed (see its log)"
trainer_rc=0
wait "$TRAINER_PID" || trainer_rc=$?
[ "$trainer_rc" -eq 0 ] || die "the trainer exited with status $trainer_rc after its input ended"
grep -q "samples" "$WORK/trainer.log" || die "the trainer printed no summary"
log "the trainer ended its pass when the input ended: $(grep -E '^samples ' "$WORK/trainer.log" | tr -s ' ')"
log "ok in $(( $(date +%s) - start ))s after the build"
