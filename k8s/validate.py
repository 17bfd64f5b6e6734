#!/usr/bin/env python3
"""Validates rendered Kubernetes manifests offline; exits 1 on any invalid object.

Usage: validate.py K8S_VERSION KUBERNETES_VALIDATE_BIN SCHEMA_DIR RENDERED.yaml...

- Core objects (every kind the Kubernetes schemas know) go through `kubernetes-validate --strict -k VERSION`
  (the PyPI package ships the schemas: no network). A core kind without a schema is an error, not a skip.
- CRD objects (PodMonitor, PrometheusRule, Certificate, Issuer) are validated with jsonschema against the
  hand-written subsets in SCHEMA_DIR, which refuse unknown fields.
- Cross-object checks of this deployment: StatefulSet replicas == num-shards in ps-server.toml == entries of
  TRAINER_PS == entries of ps-serve's --subscribe (both in shard order); Job completions == TRAINER_WORLD; every
  Service's named targetPort exists in the pods it selects; serving (docs/serving.md): probes on /readyz and
  /healthz, --listen on the container port the Service targets, --export = the read-only mount of the PVC the
  trainer's --export-dir is mounted from, a PDB and a PodMonitor endpoint for it, and the PS NetworkPolicy lets it
  reach the data port.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import jsonschema
import yaml

CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor-monitoring-v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-monitoring-v1.json",
    ("cert-manager.io/v1", "Certificate"): "certificate-cert-manager-v1.json",
    ("cert-manager.io/v1", "Issuer"): "issuer-cert-manager-v1.json",
}


def env_value(container, name):
    for e in container.get("env", []):
        if e.get("name") == name:
            return e.get("value")
    return None


def arg_value(container, flag):
    """The value of `--flag=value` or `--flag value` in the container's args, or None."""
    args = [str(a) for a in container.get("args", [])]
    for i, a in enumerate(args):
        if a.startswith(flag + "="):
            return a[len(flag) + 1 :]
        if a == flag and i + 1 < len(args):
            return args[i + 1]
    return None


def pod_templates(by_kind):
    for kind in ("Deployment", "StatefulSet", "Job", "DaemonSet"):
        for d in by_kind.get(kind, []):
            yield f"{kind}/{d['metadata']['name']}", d["spec"]["template"]


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def service_checks(path, by_kind):
    """Every named targetPort of a Service exists in each pod template the Service selects."""
    errors = []
    for svc in by_kind.get("Service", []):
        selector = svc["spec"].get("selector") or {}
        targets = [(n, t) for n, t in pod_templates(by_kind) if selects(selector, t["metadata"].get("labels", {}))]
        for port in svc["spec"].get("ports", []):
            target = port.get("targetPort", port.get("port"))
            for name, t in targets:
                cports = [p for c in t["spec"]["containers"] for p in c.get("ports", [])]
                found = [p for p in cports if p.get("name") == target or p.get("containerPort") == target]
                if not found:
                    errors.append(f"{path}: Service {svc['metadata']['name']} targets port {target!r}, which {name} does not have")
                elif found[0].get("protocol", "TCP") != port.get("protocol", "TCP"):
                    errors.append(f"{path}: Service {svc['metadata']['name']} port {target!r} protocol differs from {name}'s")
    return errors


def serving_checks(path, by_kind, ps_replicas):
    errors = []
    deps = [d for d in by_kind.get("Deployment", []) if d["metadata"]["name"] == "ps-serve"]
    if not deps:
        return errors
    dep = deps[0]
    where = f"{path}: Deployment ps-serve"
    spec = dep["spec"]["template"]["spec"]
    labels = dep["spec"]["template"]["metadata"].get("labels", {})
    c = spec["containers"][0]
    for probe, route in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        got = (c.get(probe) or {}).get("httpGet", {}).get("path")
        if got != route:
            errors.append(f"{where}: {probe} must GET {route}, has {got!r}")
    if not c.get("resources", {}).get("limits") or not c.get("resources", {}).get("requests"):
        errors.append(f"{where}: needs resource requests and limits")
    # --listen port == the container port the Service targets.
    listen = arg_value(c, "--listen") or "0.0.0.0:8500"
    http = [p for p in c.get("ports", []) if p.get("name") == "http"]
    if not http or str(http[0].get("containerPort")) != listen.rsplit(":", 1)[-1]:
        errors.append(f"{where}: --listen {listen} but container port http is {http[0].get('containerPort') if http else None}")
    svcs = [s for s in by_kind.get("Service", []) if s["metadata"]["name"] == "ps-serve"]
    if not svcs or not selects(svcs[0]["spec"].get("selector"), labels):
        errors.append(f"{path}: Service ps-serve missing or not selecting the ps-serve pods")
    # --subscribe: every PS, in shard order.
    subscribe = [e for e in (arg_value(c, "--subscribe") or "").split(",") if e]
    if ps_replicas is not None and len(subscribe) != ps_replicas:
        errors.append(f"{where}: --subscribe has {len(subscribe)} entries, StatefulSet ps has {ps_replicas} replicas")
    for i, entry in enumerate(subscribe):
        if not entry.startswith(f"ps-{i}."):
            errors.append(f"{where}: --subscribe entry {i} is {entry!r}, expected ps-{i}.<service>:<port> (shard order)")
    # --export: the read-only mount of the PVC the trainer exports into.
    export = arg_value(c, "--export")
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    m = mounts.get(export)
    claim = (vols.get(m["name"], {}).get("persistentVolumeClaim") or {}).get("claimName") if m else None
    if not m or not claim or not m.get("readOnly"):
        errors.append(f"{where}: --export {export!r} must be a read-only mount of a PersistentVolumeClaim")
    for job in by_kind.get("Job", []):
        jc = job["spec"]["template"]["spec"]["containers"][0]
        export_dir = arg_value(jc, "--export-dir")
        jm = {m["mountPath"]: m for m in jc.get("volumeMounts", [])}.get(export_dir)
        jvols = {v["name"]: v for v in job["spec"]["template"]["spec"].get("volumes", [])}
        jclaim = (jvols.get(jm["name"], {}).get("persistentVolumeClaim") or {}).get("claimName") if jm else None
        if claim and jclaim != claim:
            errors.append(f"{path}: Job {job['metadata']['name']} --export-dir {export_dir!r} is not on PVC {claim} that ps-serve reads")
    if claim and not any(p["metadata"]["name"] == claim for p in by_kind.get("PersistentVolumeClaim", [])):
        errors.append(f"{where}: PersistentVolumeClaim {claim} is not defined")
    if not any(selects(p["spec"]["selector"].get("matchLabels"), labels) for p in by_kind.get("PodDisruptionBudget", [])):
        errors.append(f"{where}: no PodDisruptionBudget selects its pods")
    pm_ports = {e.get("port") for pm in by_kind.get("PodMonitor", []) for e in pm["spec"]["podMetricsEndpoints"]}
    if by_kind.get("PodMonitor") and "http" not in pm_ports:
        errors.append(f"{path}: no PodMonitor endpoint scrapes ps-serve's http port")
    # The PS NetworkPolicy admits serving pods on the PS data port.
    for np in by_kind.get("NetworkPolicy", []):
        if np["metadata"]["name"] != "ps":
            continue
        allowed = any(
            any(selects(f.get("podSelector", {}).get("matchLabels"), labels) for f in rule.get("from", []))
            and any(p.get("port") == 7000 for p in rule.get("ports", []))
            for rule in np["spec"].get("ingress", [])
        )
        if not allowed:
            errors.append(f"{path}: NetworkPolicy ps does not let ps-serve pods reach the PS data port 7000")
    return errors


def cross_checks(path, docs):
    errors = []
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d.get("kind"), []).append(d)
    sts = [d for d in by_kind.get("StatefulSet", []) if d["metadata"]["name"] == "ps"]
    cms = [d for d in by_kind.get("ConfigMap", []) if "ps-server.toml" in d.get("data", {})]
    jobs = [d for d in by_kind.get("Job", []) if d["metadata"]["name"] == "trainer"]
    errors.extend(service_checks(path, by_kind))
    errors.extend(serving_checks(path, by_kind, sts[0]["spec"].get("replicas", 1) if sts else None))
    if not (sts and cms and jobs):
        return errors
    replicas = sts[0]["spec"].get("replicas", 1)
    m = re.search(r"^num-shards\s*=\s*(\d+)", cms[0]["data"]["ps-server.toml"], re.M)
    shards = int(m.group(1)) if m else 1
    job = jobs[0]["spec"]
    container = job["template"]["spec"]["containers"][0]
    ps = [p for p in (env_value(container, "TRAINER_PS") or "").split(",") if p]
    if not (replicas == shards == len(ps)):
        errors.append(
            f"{path}: StatefulSet ps replicas = {replicas}, ps-server.toml num-shards = {shards} and "
            f"TRAINER_PS has {len(ps)} entries; they must be equal"
        )
    for i, entry in enumerate(ps):
        if not entry.startswith(f"ps-{i}."):
            errors.append(f"{path}: TRAINER_PS entry {i} is {entry!r}, expected ps-{i}.<service>:<port> (shard order)")
    world = env_value(container, "TRAINER_WORLD")
    if str(job.get("completions")) != str(world):
        errors.append(f"{path}: Job trainer completions = {job.get('completions')} but TRAINER_WORLD = {world}")
    if job.get("completionMode") != "Indexed":
        errors.append(f"{path}: Job trainer must be Indexed (rank = completion index)")
    return errors


def main():
    version, kv_bin, schema_dir, *files = sys.argv[1:]
    errors = []
    core_files = []
    tmp = tempfile.mkdtemp(prefix="pstrain-validate-")
    counts = {"core": 0, "crd": 0}
    for path in files:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        for i, doc in enumerate(docs):
            key = (doc.get("apiVersion"), doc.get("kind"))
            name = (doc.get("metadata") or {}).get("name", "?")
            where = f"{path}: {key[1]}/{name}"
            if key in CRD_SCHEMAS:
                with open(os.path.join(schema_dir, CRD_SCHEMAS[key])) as f:
                    schema = json.load(f)
                v = jsonschema.Draft202012Validator(schema)
                for err in sorted(v.iter_errors(doc), key=lambda e: list(e.path)):
                    loc = ".".join(str(p) for p in err.path) or "(root)"
                    errors.append(f"{where} (CRD subset schema {CRD_SCHEMAS[key]}): {loc}: {err.message}")
                counts["crd"] += 1
            elif "." in (key[0] or "").split("/")[0] and not key[0].split("/")[0].endswith("k8s.io"):
                errors.append(f"{where}: custom resource {key[0]} {key[1]} has no schema in {schema_dir}; add one")
            else:
                out = os.path.join(tmp, f"{os.path.basename(path)}-{i:03d}-{key[1]}-{name}.yaml")
                with open(out, "w") as f:
                    yaml.safe_dump(doc, f)
                core_files.append((out, where))
                counts["core"] += 1
        errors.extend(cross_checks(path, docs))
    if core_files:
        r = subprocess.run(
            [kv_bin, "--strict", "-k", version, *[p for p, _ in core_files]],
            capture_output=True,
            text=True,
        )
        output = r.stdout + r.stderr
        names = {p: w for p, w in core_files}
        for line in output.splitlines():
            for p, w in names.items():
                line = line.replace(p, w)
            if line.startswith("ERROR") or "Couldn't find schema" in line:
                errors.append(line)
        if r.returncode != 0 and not errors:
            errors.append(f"kubernetes-validate exited {r.returncode}: {output.strip()}")
    for e in errors:
        print(f"INVALID {e}")
    print(
        f"validated {counts['core']} core objects (kubernetes-validate --strict, Kubernetes {version}) and "
        f"{counts['crd']} custom resources (subset schemas in {schema_dir}): "
        + ("FAILED" if errors else "ok")
    )
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
