"""The PrometheusRule manifest holds exactly the groups of deploy/prometheus/alerts.yaml."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy/prometheus/alerts.yaml"
MANIFEST = ROOT / "deploy/k8s/prometheusrule.yaml"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_prometheusrule", ROOT / "scripts/gen_prometheusrule.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gen = _script()


def test_the_manifest_is_up_to_date() -> None:
    assert gen.main(["--check", str(MANIFEST)]) == 0
    assert MANIFEST.read_text() == gen.prometheus_rule(RULES.read_text())


def test_the_manifests_groups_equal_the_rule_files() -> None:
    manifest = MANIFEST.read_text()
    assert re.search(r"^apiVersion: monitoring\.coreos\.com/v1$", manifest, re.M)
    assert re.search(r"^kind: PrometheusRule$", manifest, re.M)
    # The groups are the rule file's, line for line (indented under `spec:`).
    assert gen.spec_groups(manifest) == gen.groups_block(RULES.read_text())
    alerts = re.compile(r"^\s+- alert: (\w+)$", re.M)
    assert alerts.findall(manifest) == alerts.findall(RULES.read_text())


def test_promtool_accepts_the_manifests_groups(tmp_path: Path) -> None:
    """promtool (which `make test` installs before the unit tests) parses the manifest's
    groups as rules: the same 23 alerts, valid PromQL."""
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is missing: run the tests through `make test`"
    extracted = tmp_path / "spec.yaml"
    extracted.write_text(gen.spec_groups(MANIFEST.read_text()))
    done = subprocess.run(
        [promtool, "check", "rules", str(extracted)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rules = re.compile(r"^\s+- alert: (\w+)$", re.M)
    assert f"{len(rules.findall(RULES.read_text()))} rules found" in done.stdout


def test_a_runbook_base_replaces_every_link_and_must_be_absolute(tmp_path: Path) -> None:
    out = tmp_path / "rules.yaml"
    base = "https://wiki.example.com/bk/runbook.md"
    assert gen.main(["--format", "rules", "--runbook-base", base + "/", "--out", str(out)]) == 0
    links = re.findall(r"runbook_url: (\S+)#\w+$", out.read_text(), re.M)
    assert links and set(links) == {base}
    assert f"runbook_url: {gen.PLACEHOLDER_BASE}" not in out.read_text()
    assert gen.main(["--runbook-base", "docs/runbook.md", "--out", str(out)]) == 2


def test_labels_for_the_rule_selector(tmp_path: Path) -> None:
    out = tmp_path / "rule.yaml"
    assert gen.main(["--label", "release=kube-prometheus", "--out", str(out)]) == 0
    assert "\n    release: kube-prometheus\n" in out.read_text()
    assert gen.main(["--check", str(out)]) == 1
