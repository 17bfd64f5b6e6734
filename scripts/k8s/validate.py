#!/usr/bin/env python3
"""Validates rendered Kubernetes manifests offline; exits 1 on any invalid object.

Usage: validate.py K8S_VERSION KUBERNETES_VALIDATE_BIN SCHEMA_DIR RENDERED.yaml...

- Core objects (every kind the Kubernetes schemas know) go through `kubernetes-validate --strict -k VERSION`
  (the PyPI package ships the schemas: no network). A core kind without a schema is an error, not a skip.
- CRD objects (PodMonitor, PrometheusRule, Certificate, Issuer) are validated with jsonschema against the
  hand-written subsets in SCHEMA_DIR, which refuse unknown fields.
- Cross-object checks of this deployment (docs/replication.md, docs/deploy.md): one StatefulSet ps-N per shard,
  N = 0..num-shards-1 (ps-server.toml), each with --shard-index=N, --replica-index-from-hostname, the pod label
  pstrain/shard: "N" and --replicas naming its own pods ps-N-0.<service>:<port>, ... in ordinal order, exactly
  `replicas` of them, on the headless Service it names (which publishes not-ready pods) and the port of `listen`;
  TRAINER_PS and ps-serve's --subscribe have one `,` entry per shard whose `/` replicas are that --replicas list;
  one replica per node for each shard (an anti-affinity term on hostname selecting exactly the shard's pods); a
  PodDisruptionBudget per shard selecting exactly its pods; the PS NetworkPolicy admits PS pods (replication) and
  the PodMonitor selects PS pods and sets `shard` from pstrain/shard; alerts and dashboard queries name only
  metrics declared in a metrics.rs or in the contract's Metrics section (docs/replication.md); Job completions ==
  TRAINER_WORLD; every Service's named targetPort exists in the pods it selects; serving (docs/serving.md): probes
  on /readyz and /healthz, --listen on the container port the Service targets, --export = the read-only mount of
  the PVC the trainer's --export-dir is mounted from, a PDB and a PodMonitor endpoint for it, and the PS
  NetworkPolicy lets it reach the data port. TLS (issue 39): the PS config is the ConfigMap files the PS pods
  name with --config, later over earlier (an overlay patches the base file, never replaces it); the name each
  server verifies its peers' certificates against (replica-server-name, else the --replicas hosts) is one the
  servers' certificate carries (cert-manager dnsNames, or the generated Secret's PEM); the PS pods, trainers and
  ps-serve each present a client certificate carrying exactly their role's URI (pstrain:role/peer, trainer,
  serving).
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


def serving_checks(path, by_kind, shards):
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
    # --subscribe: every shard's replicas, like TRAINER_PS.
    if shards is not None:
        errors.extend(cluster_arg_checks(where, "--subscribe", arg_value(c, "--subscribe"), shards))
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


PS_NAME = "pstrain-ps"
SHARD_LABEL = "pstrain/shard"
HOSTNAME_KEY = "kubernetes.io/hostname"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
METRIC_RE = re.compile(r"\b((?:ps|trainer|serving)_[a-z0-9_]+)")


def declared_metrics():
    """Metric names declared in the metrics.rs files, plus the contract's Metrics section of docs/replication.md
    (names the servers are to export; they may not be in ps-server/src/metrics.rs yet)."""
    names = set()
    for rel in ("ps-server/src/metrics.rs", "trainer/src/metrics.rs", "serving/src/metrics.rs"):
        path = os.path.join(ROOT, rel)
        if not os.path.exists(path) and rel.startswith("serving/"):
            path = os.path.join(ROOT, "docs/serving.md")
        if os.path.exists(path):
            names |= set(re.findall(r'(?:"|`)((?:ps|trainer|serving)_[a-z0-9_]+)', open(path).read()))
    contract = os.path.join(ROOT, "docs/replication.md")
    if os.path.exists(contract):
        text = open(contract).read()
        m = re.search(r"^## Metrics.*?(?=^## |\Z)", text, re.M | re.S)
        if m:
            names |= set(re.findall(r"`((?:ps|trainer)_[a-z0-9_]+)`", m.group(0)))
    return names


def metric_names(expr, declared):
    found = set()
    for n in METRIC_RE.findall(expr):
        for suffix in ("_bucket", "_count", "_sum"):
            if n.endswith(suffix) and n[: -len(suffix)] in declared:
                n = n[: -len(suffix)]
        found.add(n)
    return found


def metrics_checks(path, by_kind, declared):
    """Alerts (and, once per run, the Grafana dashboards) name only declared metrics."""
    errors = []
    for rule_obj in by_kind.get("PrometheusRule", []):
        for group in rule_obj["spec"].get("groups", []):
            for rule in group.get("rules", []):
                name = rule.get("alert") or rule.get("record")
                for n in sorted(metric_names(str(rule.get("expr", "")), declared) - declared):
                    errors.append(
                        f"{path}: PrometheusRule {rule_obj['metadata']['name']} rule {name} uses {n}, which no "
                        f"metrics.rs and no Metrics section of docs/replication.md declares"
                    )
    return errors


def dashboard_checks(declared):
    errors = []
    grafana = os.path.join(ROOT, "k8s", "grafana")
    for fname in sorted(os.listdir(grafana)) if os.path.isdir(grafana) else []:
        if not fname.endswith(".json"):
            continue
        exprs = []

        def walk(o):
            if isinstance(o, dict):
                for k, v in o.items():
                    if k == "expr":
                        exprs.append(v)
                    else:
                        walk(v)
            elif isinstance(o, list):
                for v in o:
                    walk(v)

        walk(json.load(open(os.path.join(grafana, fname))))
        for n in sorted({n for e in exprs for n in metric_names(e, declared)} - declared):
            errors.append(f"k8s/grafana/{fname}: a query uses {n}, which no metrics.rs and no docs/replication.md declares")
    return errors


def labels_of(template):
    return template["metadata"].get("labels", {}) or {}


def selector_matches(selector, labels):
    """matchLabels and matchExpressions (In, NotIn, Exists, DoesNotExist) of a LabelSelector against labels."""
    if not selector:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        op, key, values = e.get("operator"), e.get("key"), e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def toml_value(cfg, key):
    """A setting of the effective PS config (a dict, see `effective_config`) as text, or None."""
    v = cfg.get(key)
    return None if v is None else str(v)


def effective_config(by_kind, path, errors):
    """The PS config every PS pod runs with: the ConfigMap files its container names with --config, in order,
    each one's settings over the ones before (as ps-server reads them). None without PS pods or ConfigMap."""
    import tomllib

    cms = [d for d in by_kind.get("ConfigMap", []) if "ps-server.toml" in d.get("data", {})]
    ps_sets = [d for d in by_kind.get("StatefulSet", []) if labels_of(d["spec"]["template"]).get("app.kubernetes.io/name") == PS_NAME]
    if not cms:
        return None
    data = cms[0]["data"]
    files = ["ps-server.toml"]
    if ps_sets:
        c = ps_sets[0]["spec"]["template"]["spec"]["containers"][0]
        args = [str(a) for a in c.get("args", [])]
        named = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"]
        named += [a[len("--config="):] for a in args if a.startswith("--config=")]
        files = [os.path.basename(f) for f in named] or files
    cfg = {}
    for name in files:
        if name not in data:
            errors.append(f"{path}: the PS pods read --config {name}, which ConfigMap {cms[0]['metadata']['name']} lacks")
            continue
        try:
            cfg.update(tomllib.loads(data[name]))
        except tomllib.TOMLDecodeError as e:
            errors.append(f"{path}: ConfigMap file {name}: {e}")
    return cfg


def certificate_info(by_kind, secret, workdir):
    """(DNS names and IPs, role URIs) of the certificate in Secret `secret`: from the cert-manager Certificate
    that writes it, or from the PEM a generated Secret holds (read with openssl). None if neither exists."""
    for cert in by_kind.get("Certificate", []):
        spec = cert["spec"]
        if spec.get("secretName") == secret:
            return (list(spec.get("dnsNames") or []) + list(spec.get("ipAddresses") or []), list(spec.get("uris") or []))
    for sec in by_kind.get("Secret", []):
        if sec["metadata"]["name"] != secret or "tls.crt" not in (sec.get("data") or {}):
            continue
        import base64

        pem = base64.b64decode(sec["data"]["tls.crt"])
        f = os.path.join(workdir, f"{secret}.pem")
        with open(f, "wb") as out:
            out.write(pem)
        r = subprocess.run(["openssl", "x509", "-in", f, "-noout", "-ext", "subjectAltName"], capture_output=True, text=True)
        if r.returncode != 0:
            return ([], [])
        names, uris = [], []
        for item in re.split(r",\s*", r.stdout.split("\n", 1)[-1].strip()):
            kind, _, value = item.partition(":")
            if kind == "DNS":
                names.append(value)
            elif kind == "IP Address":
                names.append(value)
            elif kind == "URI":
                uris.append(value)
        return (names, uris)
    return None


def name_matches(name, pattern):
    """Whether a certificate name (`ps`, `*.ps`, an IP) covers the TLS name `name`: a wildcard covers exactly
    one leftmost label."""
    name, pattern = name.lower().rstrip("."), pattern.lower().rstrip(".")
    if pattern.startswith("*."):
        head, _, rest = name.partition(".")
        return bool(head) and rest == pattern[2:]
    return name == pattern


def mounted_secret(pod_spec, filename):
    """The Secret whose key a pod's `tls` volume maps onto `filename` (e.g. server.pem), or None."""
    for v in pod_spec.get("volumes", []):
        sources = [{"secret": v["secret"]}] if "secret" in v else (v.get("projected") or {}).get("sources", [])
        for src in sources:
            sec = src.get("secret")
            if sec and any(i.get("path") == filename for i in sec.get("items", [])):
                # A projected source names it `name`, a secret volume `secretName`.
                return sec.get("secretName") or sec.get("name")
    return None


def tls_checks(path, by_kind, cfg, shards, workdir):
    """Each overlay's servers verify their peers against a name the servers' certificate carries (the cause of
    a prod overlay whose replicas could never reach each other), and each workload presents a client
    certificate of its role (protocol::auth)."""
    errors = []
    if not by_kind.get("Certificate") and not by_kind.get("Secret"):
        return errors  # the base: TLS material comes from an overlay
    # The name a server verifies its peers' certificates against: replica-server-name, else each --replicas
    # entry's host (ps-server's default).
    configured = cfg.get("replica-server-name") if cfg else None
    expected = set()
    for n, sh in (shards or {}).items():
        for entry in sh["replicas_arg"]:
            expected.add(configured or entry.rpartition(":")[0].strip("[]"))
    for n, sh in sorted((shards or {}).items()):
        spec = sh["sts"]["spec"]["template"]["spec"]
        server = mounted_secret(spec, "server.pem")
        info = certificate_info(by_kind, server, workdir) if server else None
        if info is None:
            errors.append(f"{path}: StatefulSet ps-{n} mounts no server certificate (server.pem) from a Secret or Certificate here")
            continue
        names, _ = info
        for want in sorted(expected):
            if not any(name_matches(want, p) for p in names):
                errors.append(
                    f"{path}: StatefulSet ps-{n}: its replicas verify each other's certificates against {want!r} "
                    f"(replica-server-name {'= ' + repr(configured) if configured else 'unset: the --replicas hosts'}), "
                    f"but the server certificate (Secret {server}) carries only {names}: every replica-to-replica "
                    f"TLS connection would fail"
                )
    # Client certificates by workload: the PS pods' peer.pem, the trainers' trainer.pem, ps-serve's serving.pem.
    workloads = [(f"StatefulSet {sh['sts']['metadata']['name']}", sh["sts"]["spec"]["template"]["spec"], "peer") for sh in (shards or {}).values()]
    workloads += [(f"Job {j['metadata']['name']}", j["spec"]["template"]["spec"], "trainer") for j in by_kind.get("Job", [])]
    workloads += [(f"Deployment {d['metadata']['name']}", d["spec"]["template"]["spec"], "serving") for d in by_kind.get("Deployment", []) if d["metadata"]["name"] == "ps-serve"]
    for where, spec, role in workloads:
        secret = mounted_secret(spec, f"{role}.pem")
        if secret is None:
            errors.append(f"{path}: {where} mounts no {role}.pem: its client certificate must be of role {role}")
            continue
        info = certificate_info(by_kind, secret, workdir)
        if info is None:
            errors.append(f"{path}: {where} mounts {role}.pem from Secret {secret}, which no Certificate or Secret here provides")
            continue
        _, uris = info
        roles = [u for u in uris if u.startswith("pstrain:role/")]
        if roles != [f"pstrain:role/{role}"]:
            errors.append(f"{path}: {where}: {role}.pem (Secret {secret}) carries role URIs {roles}, expected exactly ['pstrain:role/{role}']")
    return errors


def cluster_arg_checks(where, what, value, shards):
    """`value` (TRAINER_PS or --subscribe) lists, per shard in order, that shard's --replicas in the same order."""
    errors = []
    entries = [e for e in (value or "").split(",") if e]
    if len(entries) != len(shards):
        errors.append(f"{where}: {what} has {len(entries)} shard entries, there are {len(shards)} shards (StatefulSets ps-N)")
    for i, entry in enumerate(entries):
        want = shards.get(i, {}).get("replicas_arg")
        got = entry.split("/")
        if want is not None and got != want:
            errors.append(
                f"{where}: {what} entry {i} is {entry!r}; shard {i}'s replicas in replica order are {'/'.join(want)!r} "
                f"(the --replicas of StatefulSet ps-{i})"
            )
    return errors


def shard_checks(path, by_kind, toml):
    """The per-shard StatefulSets, `toml` the effective PS config (a dict). Returns (errors, {shard: {sts,
    labels, replicas, replicas_arg}})."""
    errors = []
    shards = {}
    num_shards = int(toml_value(toml, "num-shards") or 1)
    listen_port = (toml_value(toml, "listen") or "127.0.0.1:7000").rsplit(":", 1)[-1]
    services = {s["metadata"]["name"]: s for s in by_kind.get("Service", [])}
    ps_sets = [d for d in by_kind.get("StatefulSet", []) if labels_of(d["spec"]["template"]).get("app.kubernetes.io/name") == PS_NAME]
    for sts in ps_sets:
        name = sts["metadata"]["name"]
        where = f"{path}: StatefulSet {name}"
        m = re.fullmatch(r"ps-(\d+)", name)
        if not m:
            errors.append(f"{where}: a PS StatefulSet must be named ps-<shard> (its pods ps-<shard>-<replica>)")
            continue
        n = int(m.group(1))
        if n in shards:
            errors.append(f"{where}: shard {n} has two StatefulSets")
            continue
        tmpl = sts["spec"]["template"]
        labels = labels_of(tmpl)
        c = tmpl["spec"]["containers"][0]
        replicas = sts["spec"].get("replicas", 1)
        if labels.get(SHARD_LABEL) != str(n):
            errors.append(f"{where}: pod label {SHARD_LABEL} is {labels.get(SHARD_LABEL)!r}, expected {str(n)!r}")
        if (sts["spec"]["selector"].get("matchLabels") or {}).get(SHARD_LABEL) != str(n):
            errors.append(f"{where}: selector must include {SHARD_LABEL}: {str(n)!r} (StatefulSets of two shards must not select each other's pods)")
        if arg_value(c, "--shard-index") != str(n):
            errors.append(f"{where}: --shard-index is {arg_value(c, '--shard-index')!r}, expected {n}")
        args = [str(a) for a in c.get("args", [])]
        if "--shard-index-from-hostname" in args:
            errors.append(f"{where}: --shard-index-from-hostname reads the replica ordinal from ps-N-r, use --shard-index={n}")
        if replicas > 1 and "--replica-index-from-hostname" not in args:
            errors.append(f"{where}: {replicas} replicas need --replica-index-from-hostname (pod ps-{n}-r is replica r)")
        svc_name = sts["spec"].get("serviceName")
        svc = services.get(svc_name)
        if not svc:
            errors.append(f"{where}: serviceName {svc_name!r} is not a Service here (pods get no DNS names ps-{n}-r.{svc_name})")
        else:
            if svc["spec"].get("clusterIP") != "None":
                errors.append(f"{path}: Service {svc_name} must be headless (clusterIP: None) for per-pod DNS names")
            if not svc["spec"].get("publishNotReadyAddresses"):
                errors.append(f"{path}: Service {svc_name} must set publishNotReadyAddresses: replicas find each other before they are ready")
            if not selects(svc["spec"].get("selector"), labels):
                errors.append(f"{path}: Service {svc_name} does not select the pods of StatefulSet {name}")
        # --replicas: this StatefulSet's pods, in ordinal order, on the listen port.
        got = [e for e in (arg_value(c, "--replicas") or "").split(",") if e]
        want_hosts = [f"ps-{n}-{r}.{svc_name}" for r in range(replicas)]
        replicas_arg = got
        if len(got) != replicas:
            errors.append(f"{where}: --replicas has {len(got)} entries, the StatefulSet has replicas: {replicas}")
        for r, entry in enumerate(got):
            host, _, port = entry.rpartition(":")
            if r < replicas and not (host == want_hosts[r] or host.startswith(want_hosts[r] + ".")):
                errors.append(f"{where}: --replicas entry {r} is {entry!r}, expected {want_hosts[r]}:{listen_port} (pod ordinal order)")
            if port != listen_port:
                errors.append(f"{where}: --replicas entry {r} is on port {port!r}, ps-server.toml listens on {listen_port}")
        # One replica per node: a term on hostname whose selector matches this shard's pods and no other shard's.
        others = [labels_of(o["spec"]["template"]) for o in ps_sets if o is not sts]
        anti = (tmpl["spec"].get("affinity") or {}).get("podAntiAffinity") or {}
        terms = list(anti.get("requiredDuringSchedulingIgnoredDuringExecution") or []) + [
            t.get("podAffinityTerm", {}) for t in anti.get("preferredDuringSchedulingIgnoredDuringExecution") or []
        ]
        if replicas > 1 and not any(
            t.get("topologyKey") == HOSTNAME_KEY
            and selector_matches(t.get("labelSelector"), labels)
            and not any(selector_matches(t.get("labelSelector"), o) for o in others)
            for t in terms
        ):
            errors.append(f"{where}: no pod anti-affinity term on {HOSTNAME_KEY} selecting exactly shard {n}'s pods (its replicas may share a node)")
        shards[n] = {"sts": sts, "labels": labels, "replicas": replicas, "replicas_arg": replicas_arg}
    if sorted(shards) != list(range(num_shards)):
        errors.append(
            f"{path}: PS StatefulSets are for shards {sorted(shards)}, ps-server.toml num-shards = {num_shards}: "
            f"expected one StatefulSet ps-N for each N in 0..{num_shards - 1}"
        )
    durability = toml_value(toml, "durability")
    if durability is not None and durability not in ("none", "periodic", "sync", "replicated"):
        errors.append(f"{path}: ps-server.toml durability = {durability!r}, expected none, periodic, sync or replicated")
    # A PodDisruptionBudget per shard, selecting exactly its pods.
    for n, sh in sorted(shards.items()):
        pdbs = [p for p in by_kind.get("PodDisruptionBudget", []) if selector_matches(p["spec"].get("selector"), sh["labels"])]
        if len(pdbs) != 1:
            errors.append(f"{path}: shard {n}: {len(pdbs)} PodDisruptionBudgets select its pods, expected exactly one")
        for pdb in pdbs:
            wide = [m for m, o in shards.items() if m != n and selector_matches(pdb["spec"].get("selector"), o["labels"])]
            if wide:
                errors.append(f"{path}: PodDisruptionBudget {pdb['metadata']['name']} also selects the pods of shards {wide}: one budget per shard")
            mu = pdb["spec"].get("maxUnavailable")
            if mu is None or str(mu) not in ("1",):
                errors.append(f"{path}: PodDisruptionBudget {pdb['metadata']['name']} must have maxUnavailable: 1 (one replica of a shard at a time)")
    if shards:
        ps_labels = next(iter(shards.values()))["labels"]
        for np in by_kind.get("NetworkPolicy", []):
            if not selector_matches(np["spec"].get("podSelector"), ps_labels):
                continue
            for proto in ("UDP", "TCP"):
                ok = any(
                    any(selects(f.get("podSelector", {}).get("matchLabels"), ps_labels) for f in rule.get("from", []))
                    and any(p.get("port") == int(listen_port) and p.get("protocol", "TCP") == proto for p in rule.get("ports", []))
                    for rule in np["spec"].get("ingress", [])
                )
                if not ok:
                    errors.append(f"{path}: NetworkPolicy {np['metadata']['name']} does not admit PS pods on {proto} {listen_port} (replication between replicas)")
        for pm in by_kind.get("PodMonitor", []):
            if not selector_matches(pm["spec"].get("selector"), ps_labels):
                errors.append(f"{path}: PodMonitor {pm['metadata']['name']} does not select the PS pods")
                continue
            eps = [e for e in pm["spec"]["podMetricsEndpoints"] if e.get("port") == "metrics"]
            sanitized = "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", SHARD_LABEL)
            if not any(
                r.get("targetLabel") == "shard" and sanitized in (r.get("sourceLabels") or [])
                and r.get("action", "replace").lower() == "replace"
                for e in eps for r in e.get("relabelings") or []
            ):
                errors.append(f"{path}: PodMonitor {pm['metadata']['name']} endpoint `metrics` must set label shard from {sanitized} (the replication alerts group by it)")
    return errors, shards


MONITORING_NAMESPACE = "monitoring"
METRICS_PORT = 9100


def metrics_port_checks(path, by_kind):
    """Issue 40: the metrics port (9100) is reachable from the monitoring namespace only: every ingress rule that
    opens it admits exactly that namespace (by its kubernetes.io/metadata.name label), nothing wider."""
    errors = []
    for np in by_kind.get("NetworkPolicy", []):
        for i, rule in enumerate(np["spec"].get("ingress", [])):
            if not any(p.get("port") == METRICS_PORT for p in rule.get("ports", [])):
                continue
            froms = rule.get("from") or []
            wanted = {"kubernetes.io/metadata.name": MONITORING_NAMESPACE}
            if not froms or any(
                "podSelector" in f or "ipBlock" in f or (f.get("namespaceSelector") or {}).get("matchLabels") != wanted
                for f in froms
            ):
                errors.append(
                    f"{path}: NetworkPolicy {np['metadata']['name']} ingress rule {i} opens the metrics port "
                    f"{METRICS_PORT} to {froms or 'everyone'}; only the {MONITORING_NAMESPACE} namespace may scrape it"
                )
    return errors


def cross_checks(path, docs, declared):
    errors = []
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d.get("kind"), []).append(d)
    jobs = [d for d in by_kind.get("Job", []) if d["metadata"]["name"] == "trainer"]
    errors.extend(service_checks(path, by_kind))
    errors.extend(metrics_checks(path, by_kind, declared))
    errors.extend(metrics_port_checks(path, by_kind))
    shards = None
    cfg = effective_config(by_kind, path, errors)
    if cfg is not None:
        shard_errors, shards = shard_checks(path, by_kind, cfg)
        errors.extend(shard_errors)
        with tempfile.TemporaryDirectory() as workdir:
            errors.extend(tls_checks(path, by_kind, cfg, shards, workdir))
    errors.extend(serving_checks(path, by_kind, shards))
    if not (shards and jobs):
        return errors
    job = jobs[0]["spec"]
    container = job["template"]["spec"]["containers"][0]
    errors.extend(cluster_arg_checks(f"{path}: Job trainer", "TRAINER_PS", env_value(container, "TRAINER_PS"), shards))
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
    declared = declared_metrics()
    errors.extend(dashboard_checks(declared))
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
        errors.extend(cross_checks(path, docs, declared))
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
