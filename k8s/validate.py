#!/usr/bin/env python3
"""Validates rendered Kubernetes manifests offline; exits 1 on any invalid object.

Usage: validate.py K8S_VERSION KUBERNETES_VALIDATE_BIN SCHEMA_DIR RENDERED.yaml...

- Core objects (every kind the Kubernetes schemas know) go through `kubernetes-validate --strict -k VERSION`
  (the PyPI package ships the schemas: no network). A core kind without a schema is an error, not a skip.
- CRD objects (PodMonitor, PrometheusRule, Certificate, Issuer) are validated with jsonschema against the
  hand-written subsets in SCHEMA_DIR, which refuse unknown fields.
- Cross-object checks of this deployment: StatefulSet replicas == num-shards in ps-server.toml == entries of
  TRAINER_PS; Job completions == TRAINER_WORLD.
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


def cross_checks(path, docs):
    errors = []
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d.get("kind"), []).append(d)
    sts = [d for d in by_kind.get("StatefulSet", []) if d["metadata"]["name"] == "ps"]
    cms = [d for d in by_kind.get("ConfigMap", []) if "ps-server.toml" in d.get("data", {})]
    jobs = [d for d in by_kind.get("Job", []) if d["metadata"]["name"] == "trainer"]
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
