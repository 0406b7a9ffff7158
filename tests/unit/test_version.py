"""`bk-auditor --version`, and one version everywhere a release is named.

pyproject.toml's `version` is the one source of truth: the installed metadata carries it to
`--version`; the Dockerfile's VERSION, the Kubernetes image tag and the wheel and image names
the docs tell to install must all say the same (`make wheel-check` runs the installed wheel).
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from auditor.cli.main import main, package_version

ROOT = Path(__file__).resolve().parents[2]


def _project_version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def test_version_prints_the_installed_version_and_exits_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    out, err = capsys.readouterr()
    assert out == f"bk-auditor {importlib.metadata.version('bookkeeper-auditor')}\n"
    assert err == ""


def test_the_installed_version_is_pyprojects() -> None:
    # A stale editable install (pyproject bumped, not reinstalled) would print an old one.
    assert package_version() == _project_version()


def test_version_needs_no_cluster_and_no_subcommand(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "auditor", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"bk-auditor {_project_version()}\n"


def test_help_lists_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "--version" in capsys.readouterr().out


def _release_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "Dockerfile"]
    files += sorted((ROOT / "docs").glob("*.md"))
    files += sorted(p for p in (ROOT / "deploy").rglob("*") if p.is_file())
    return files


#: A wheel or sdist of the project, or an image of it, named with a version.
_NAMED = re.compile(
    r"bookkeeper_auditor-(\d+\.\d+\.\d+[^-\s/]*?)(?:-py3-none-any\.whl|-\*\.whl|-cp\d+|\.tar\.gz)"
    r"|bk-auditor(?:-spark)?:(\d+\.\d+\.\d+[\w.+-]*)"
)


def test_every_named_release_is_this_version() -> None:
    version = _project_version()
    named = []
    for path in _release_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in _NAMED.finditer(text):
            named.append((path.relative_to(ROOT).as_posix(), m.group(0), m.group(1) or m.group(2)))
    wrong = [(path, name) for path, name, v in named if v != version]
    assert not wrong, f"not version {version}: {wrong}"
    # The install lines this test guards are there at all.
    where = {path for path, _, _ in named}
    assert {
        "Dockerfile",
        "deploy/k8s/deployment.yaml",
        "deploy/systemd/bk-auditor.service",
    } <= where


def test_the_dockerfile_and_kubernetes_use_this_version() -> None:
    version = _project_version()
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(rf"^ARG VERSION={re.escape(version)}$", dockerfile, re.M)
    assert "org.opencontainers.image.version=" in dockerfile
    assert "-c /tmp/constraints.txt" in dockerfile
    # The base image is an exact release, not a moving tag such as python:3.11-slim.
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", dockerfile, re.M)
    assert base and re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base[1])
    deployment = (ROOT / "deploy/k8s/deployment.yaml").read_text(encoding="utf-8")
    assert re.search(rf"^\s+image: bk-auditor:{re.escape(version)}$", deployment, re.M)
    kustomization = (ROOT / "deploy/k8s/kustomization.yaml").read_text(encoding="utf-8")
    assert re.search(rf"^\s+newTag: {re.escape(version)}$", kustomization, re.M)
