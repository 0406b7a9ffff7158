"""deploy/k8s as `kubectl apply -k` takes it: what refers to what, read with the stdlib.

No YAML library is a dependency, so the manifests are read by `load`, a reader of the
block YAML they are written in (mappings, sequences, plain, quoted and JSON flow
scalars); anything else in them fails these tests rather than being misread.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from auditor.daemon.config import load_daemon_config
from auditor.secretfiles import check_api_token
from auditor.zk.security import parse_zk_auth

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy/k8s"
#: Files of deploy/k8s that are not resources of the kustomization, and why.
NOT_RESOURCES = {
    "kustomization.yaml": "the kustomization itself",
    "secret.example.yaml": "an example: real secrets stay out of git",
    "prometheusrule.yaml": "optional: needs the Prometheus Operator's CRD",
}


# --- a reader of the YAML subset the manifests use ----------------------------------------


def _lines(text: str) -> list[tuple[int, str]]:
    out = []
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#") or stripped == "---":
            continue
        # A comment after a value: " #" outside quotes (the manifests quote no '#').
        if " #" in raw and raw.count('"') % 2 == 0 and '"' not in raw.split(" #", 1)[1]:
            raw = raw.split(" #", 1)[0]
        out.append((len(raw) - len(raw.lstrip(" ")), raw.strip()))
    return out


def _scalar(text: str) -> Any:
    if text.startswith(("[", "{", '"')):
        return json.loads(text)
    if text.startswith("'") and text.endswith("'"):
        return text[1:-1].replace("''", "'")
    if text in ("|", ">", "|-", ">-"):
        raise ValueError("block scalars are not read here")
    if text in ("true", "false"):
        return text == "true"
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return text


def _block(lines: list[tuple[int, str]], i: int, indent: int) -> tuple[Any, int]:
    if lines[i][1].startswith("- ") or lines[i][1] == "-":
        out: list[Any] = []
        while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("-"):
            rest = lines[i][1][1:].strip()
            if not rest:
                value, i = _block(lines, i + 1, lines[i + 1][0])
            elif re.match(r"^[\w./-]+:( |$)", rest):  # "- key: value": a mapping
                lines[i] = (indent + 2, rest)
                value, i = _block(lines, i, indent + 2)
            else:
                value, i = _scalar(rest), i + 1
            out.append(value)
        return out, i
    mapping: dict[str, Any] = {}
    while i < len(lines) and lines[i][0] == indent and not lines[i][1].startswith("- "):
        key, sep, rest = lines[i][1].partition(":")
        assert sep, f"not a mapping entry: {lines[i][1]!r}"
        key, rest = key.strip().strip('"'), rest.strip()
        if rest:
            mapping[key], i = _scalar(rest), i + 1
        elif i + 1 < len(lines) and (
            lines[i + 1][0] > indent
            or (lines[i + 1][0] == indent and lines[i + 1][1].startswith("- "))
        ):
            mapping[key], i = _block(lines, i + 1, lines[i + 1][0])
        else:
            mapping[key], i = None, i + 1
    return mapping, i


def load(path: Path) -> Any:
    lines = _lines(path.read_text(encoding="utf-8"))
    value, end = _block(lines, 0, lines[0][0])
    assert end == len(lines), f"{path.name}: not read past {lines[end]}"
    return value


def test_the_reader() -> None:
    text = 'a: 1\nb:\n  - x\n  - k: "v"\n    n: [1, "2"]\n# c\nc:\n- y # note\nd: \'q\'\ne: true\n'
    value, _ = _block(_lines(text), 0, 0)
    assert value == {"a": 1, "b": ["x", {"k": "v", "n": [1, "2"]}], "c": ["y"], "d": "q", "e": True}
    with pytest.raises(ValueError):
        _block(_lines("a: |\n  text\n"), 0, 0)


# --- the manifests ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kustomization() -> dict[str, Any]:
    value: dict[str, Any] = load(K8S / "kustomization.yaml")
    return value


@pytest.fixture(scope="module")
def deployment() -> dict[str, Any]:
    value: dict[str, Any] = load(K8S / "deployment.yaml")
    assert value["kind"] == "Deployment"
    return value


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    value: dict[str, Any] = container
    return value


def _container_ports(deployment: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in _container(deployment)["ports"]}


def test_the_kustomization_lists_every_manifest(kustomization: dict[str, Any]) -> None:
    resources = kustomization["resources"]
    on_disk = {p.name for p in K8S.glob("*.yaml")}
    assert set(resources) == on_disk - set(NOT_RESOURCES), "a manifest missing or extra"
    assert len(resources) == len(set(resources))
    for name, why in NOT_RESOURCES.items():
        assert (K8S / name).is_file(), why
    # The optional rule file is offered, commented out.
    text = (K8S / "kustomization.yaml").read_text(encoding="utf-8")
    assert re.search(r"^\s*#\s*- prometheusrule\.yaml$", text, re.M)
    for name in resources:
        kind = load(K8S / name)["kind"]
        assert kind != "ConfigMap", f"{name}: the ConfigMap comes from configMapGenerator"


def test_the_deployment_mounts_the_generated_configmap(
    kustomization: dict[str, Any], deployment: dict[str, Any]
) -> None:
    [generator] = kustomization["configMapGenerator"]
    assert generator["files"] == ["auditor.toml"]
    assert (K8S / "auditor.toml").is_file()
    # No disableNameSuffixHash: the name carries the content's hash, the rollout trigger.
    assert "options" not in generator and "generatorOptions" not in kustomization
    pod = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    [config] = [v for v in volumes.values() if "configMap" in v]
    assert config["configMap"]["name"] == generator["name"]
    [mount] = [m for m in _container(deployment)["volumeMounts"] if m["name"] == config["name"]]
    args = _container(deployment)["args"]
    assert args[args.index("--config") + 1] == f"{mount['mountPath']}/auditor.toml"


def test_the_generated_configuration_is_one_the_daemon_takes(deployment: dict[str, Any]) -> None:
    cfg = load_daemon_config(str(K8S / "auditor.toml"), env={}, hostname="bk-auditor-0")
    ports = _container_ports(deployment)
    assert cfg.api.port == ports["grpc"]
    assert cfg.metrics.port == ports["metrics"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert _container(deployment)[probe]["grpc"]["port"] == cfg.api.port


def test_the_service_exposes_the_containers_ports(deployment: dict[str, Any]) -> None:
    service = load(K8S / "service.yaml")
    ports = _container_ports(deployment)
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_the_network_policy_selects_the_pods_and_opens_exactly_their_ports(
    deployment: dict[str, Any],
) -> None:
    policy = load(K8S / "networkpolicy.yaml")
    assert policy["kind"] == "NetworkPolicy"
    spec = policy["spec"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert spec["podSelector"]["matchLabels"].items() <= labels.items()
    assert spec["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert set(spec["policyTypes"]) == {"Ingress", "Egress"}
    opened = []
    for rule in spec["ingress"]:
        assert rule.get("from"), "an ingress rule without `from` admits everyone"
        for peer in rule["from"]:
            selector = peer.get("podSelector") or peer.get("namespaceSelector")
            assert selector and selector["matchLabels"], "each peer is chosen by a label"
        opened += [(p["protocol"], p["port"]) for p in rule["ports"]]
    assert sorted(opened) == sorted(("TCP", port) for port in _container_ports(deployment).values())
    # Egress: DNS, ZooKeeper (plain and TLS) and the bookies, as its header documents.
    out = {(p["protocol"], p["port"]) for rule in spec["egress"] for p in rule["ports"]}
    assert out == {("UDP", 53), ("TCP", 53), ("TCP", 2181), ("TCP", 2281), ("TCP", 3181)}


def test_the_secret_example_holds_what_the_deployment_reads(deployment: dict[str, Any]) -> None:
    secret = load(K8S / "secret.example.yaml")
    assert secret["kind"] == "Secret"
    refs = {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in _container(deployment)["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert {r["name"] for r in refs.values()} == {secret["metadata"]["name"]}
    assert all(r["optional"] is True for r in refs.values())
    assert {r["key"] for r in refs.values()} == set(secret["stringData"])
    # The variables are the daemon's: each lands in the key it is documented for.
    env = {name: secret["stringData"][ref["key"]] for name, ref in refs.items()}
    assert set(env) == {"BK_AUDITOR_API_TOKEN", "BK_AUDITOR_DAEMON_ZK_AUTH"}
    cfg = load_daemon_config(str(K8S / "auditor.toml"), env=env, hostname="bk-auditor-0")
    assert cfg.api.token == env["BK_AUDITOR_API_TOKEN"]
    check_api_token(cfg.api.token)
    assert cfg.daemon.zk_auth == env["BK_AUDITOR_DAEMON_ZK_AUTH"]
    assert parse_zk_auth(cfg.daemon.zk_auth).digest
    # Not applied with the rest: no real secret is kept in the kustomization.
    kustomization = load(K8S / "kustomization.yaml")
    assert "secret.example.yaml" not in kustomization["resources"]
    assert "secretGenerator" not in kustomization


def test_the_readme_lists_every_file(kustomization: dict[str, Any]) -> None:
    readme = (ROOT / "deploy/README.md").read_text(encoding="utf-8")
    for name in {p.name for p in K8S.iterdir()}:
        assert f"k8s/{name}" in readme, f"deploy/README.md does not name k8s/{name}"
