#!/usr/bin/env bash
# Renders every kustomize overlay (base, dev, prod) and validates every object offline:
# core objects against the Kubernetes JSON schemas shipped by the PyPI package kubernetes-validate (--strict),
# custom resources against k8s/schemas/*.json. Then checks that deliberately broken manifests are refused.
# Exits non-zero on any invalid object. Needs python3 and either `kubectl` (built-in kustomize) or `kustomize`.
#
# Env: K8S_VERSION (default 1.29.0), PSTRAIN_K8S_VENV (virtualenv for kubernetes-validate,
#      default ${XDG_CACHE_HOME:-$HOME/.cache}/pstrain-k8s-venv).
set -euo pipefail

SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
HERE="$(cd "$SELF/../../k8s" && pwd)"
K8S_VERSION="${K8S_VERSION:-1.29.0}"
KV_VERSION="1.37.0"
VENV="${PSTRAIN_K8S_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/pstrain-k8s-venv}"
start=$(date +%s)
log() { echo "validate: $*" >&2; }

# --- tools -------------------------------------------------------------------------------------------------
if command -v kubectl >/dev/null 2>&1; then
    render() { kubectl kustomize "$1"; }
    log "rendering with $(kubectl version --client 2>/dev/null | grep -i kustomize || echo 'kubectl kustomize')"
elif command -v kustomize >/dev/null 2>&1; then
    render() { kustomize build "$1"; }
    log "rendering with kustomize $(kustomize version 2>/dev/null || true)"
else
    log "neither kubectl nor kustomize is installed; kustomize is not packaged in Debian 12 or on PyPI:"
    log "install kubectl (https://kubernetes.io/docs/tasks/tools/) or kustomize, then rerun"
    exit 2
fi
if [ ! -x "$VENV/bin/kubernetes-validate" ] \
    || ! "$VENV/bin/pip" show kubernetes-validate 2>/dev/null | grep "^Version: $KV_VERSION$" >/dev/null; then
    log "installing kubernetes-validate==$KV_VERSION into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$KV_VERSION"
fi
PY="$VENV/bin/python"
KV="$VENV/bin/kubernetes-validate"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# --- render ------------------------------------------------------------------------------------------------
# Render from a copy. The dev overlay's TLS files (git-ignored, made by `ps-server certs init --name ps` as
# docs/deploy.md says) are made here the same way when absent, so the TLS checks (the name each server verifies
# its peers against is on the server certificate; each workload's client certificate has its role) read real
# certificates in every overlay.
cp -r "$HERE/base" "$HERE/overlays" "$WORK/"
mkdir -p "$WORK/overlays/dev/tls"
if [ ! -e "$WORK/overlays/dev/tls/server.pem" ]; then
    log "dev TLS files absent in k8s/overlays/dev/tls: making them with ps-server certs init --name ps"
    (cd "$HERE/.." && cargo run -q --release -p ps-server -- certs init --tls-dir "$WORK/overlays/dev/tls" --name ps) >/dev/null
fi

rendered=()
for target in base overlays/dev overlays/prod; do
    out="$WORK/rendered-${target//\//-}.yaml"
    render "$WORK/$target" > "$out"
    log "rendered $target: $(grep -c '^kind:' "$out") objects"
    rendered+=("$out")
done

# --- validate ----------------------------------------------------------------------------------------------
"$PY" "$SELF/validate.py" "$K8S_VERSION" "$KV" "$HERE/schemas" "${rendered[@]}"

# --- self-test: broken manifests must be refused ------------------------------------------------------------
dev="$WORK/rendered-overlays-dev.yaml"
selftest() { # name, python expression transforming the list `docs`
    local name="$1" expr="$2" broken="$WORK/broken-$1.yaml"
    "$PY" - "$dev" "$broken" "$expr" <<'PYEOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
exec(sys.argv[3])
yaml.safe_dump_all(docs, open(sys.argv[2], "w"))
PYEOF
    if "$PY" "$SELF/validate.py" "$K8S_VERSION" "$KV" "$HERE/schemas" "$broken" > "$WORK/selftest.log" 2>&1; then
        cat "$WORK/selftest.log" >&2
        log "SELF-TEST FAILED: broken manifest '$name' was accepted"
        exit 1
    fi
    log "self-test '$name' refused as expected: $(grep -m1 INVALID "$WORK/selftest.log" | cut -c1-160)"
}
selftest port-type 'by[("Service","ps")]["spec"]["ports"][0]["port"] = "seven-thousand"'
ps0='by[("StatefulSet","ps-0")]["spec"]'
selftest unknown-field "$ps0"'["template"]["spec"]["containers"][0]["livenessprobe"] = {}'
selftest missing-required 'del by[("Job","trainer")]["spec"]["template"]["spec"]["containers"][0]["name"]'
selftest crd-unknown-field 'by[("PodMonitor","pstrain")]["spec"]["podMetricEndpoints"] = []'
selftest unknown-crd 'docs.append({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {}})'
# Replicated shards (docs/replication.md).
selftest shard-missing 'docs.remove(by[("StatefulSet","ps-1")])'
selftest replicas-count "$ps0"'["replicas"] = 3'
ps0args="$ps0"'["template"]["spec"]["containers"][0]["args"]'
selftest replicas-order "$ps0args"'[-1] = "--replicas=ps-0-1.ps:7000,ps-0-0.ps:7000"'
selftest replicas-other-shard "$ps0args"'[-1] = "--replicas=ps-1-0.ps:7000,ps-1-1.ps:7000"'
selftest shard-index "$ps0args"'[-2] = "--shard-index=1"'
selftest trainer-ps-flat 'by[("Job","trainer")]["spec"]["template"]["spec"]["containers"][0]["env"][2]["value"] = "ps-0-0.ps:7000,ps-1-0.ps:7000"'
selftest trainer-ps-order 'by[("Job","trainer")]["spec"]["template"]["spec"]["containers"][0]["env"][2]["value"] = "ps-0-1.ps:7000/ps-0-0.ps:7000,ps-1-0.ps:7000/ps-1-1.ps:7000"'
selftest pdb-missing 'docs.remove(by[("PodDisruptionBudget","ps-1")])'
selftest pdb-all-shards 'del by[("PodDisruptionBudget","ps-0")]["spec"]["selector"]["matchLabels"]["pstrain/shard"]'
selftest same-node "$ps0"'["template"]["spec"]["affinity"] = {}'
selftest ready-only-dns 'del by[("Service","ps")]["spec"]["publishNotReadyAddresses"]'
selftest np-no-peers 'del by[("NetworkPolicy","ps")]["spec"]["ingress"][1]'
selftest metrics-port-open 'by[("NetworkPolicy","ps")]["spec"]["ingress"][2]["from"] = [{"namespaceSelector": {}}]'
selftest no-shard-label 'del by[("PodMonitor","pstrain")]["spec"]["podMetricsEndpoints"][0]["relabelings"]'
selftest alert-unknown-metric 'by[("PrometheusRule","pstrain")]["spec"]["groups"][0]["rules"][0]["expr"] = "ps_replication_lag_secs > 5"'
serve='by[("Deployment","ps-serve")]["spec"]["template"]["spec"]'
selftest serve-subscribe "$serve"'["containers"][0]["args"][2] = "--subscribe=ps-1-0.ps:7000/ps-1-1.ps:7000,ps-0-0.ps:7000/ps-0-1.ps:7000"'
selftest serve-no-readiness "del $serve"'["containers"][0]["readinessProbe"]'
selftest serve-export-rw "$serve"'["containers"][0]["volumeMounts"][0]["readOnly"] = False'
selftest serve-port 'by[("Service","ps-serve")]["spec"]["ports"][0]["targetPort"] = "metrics"'
selftest serve-no-pdb 'docs.remove(by[("PodDisruptionBudget","ps-serve")])'
# TLS (issue 39): an overlay whose servers verify their peers against a name the certificate lacks (what the
# prod overlay did when it replaced ps-server.toml), one that replaces the base file, and client certificates
# of the wrong role.
cm='by[("ConfigMap","pstrain-config")]["data"]'
selftest peer-name-not-on-cert "$cm"'["overlay.toml"] = "replica-server-name = \"ps-peers.example\"\n"'
selftest overlay-replaces-base "$cm"'["ps-server.toml"] = "listen = \"0.0.0.0:7000\"\nnum-shards = 2\nreplica-server-name = \"nowhere.example\"\n"'
tls='by[("Job","trainer")]["spec"]["template"]["spec"]["volumes"]'
selftest trainer-peer-cert 'v = [v for v in '"$tls"' if v["name"] == "tls"][0]; v["secret"]["secretName"] = "pstrain-ps-peer-tls"'
selftest ps-no-peer-cert 'v = [v for v in '"$ps0"'["template"]["spec"]["volumes"] if v["name"] == "tls"][0]; v["projected"]["sources"][1]["secret"]["items"][0]["path"] = "client.pem"'

log "all overlays valid; self-tests passed ($(( $(date +%s) - start ))s)"
