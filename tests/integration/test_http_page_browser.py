"""The daemon's HTML page in headless Chromium (Debian's `chromium`; `make test` installs it).

A real in-process daemon leads a demo-sized cluster (`test_http_views.seed`: one
seeded fault per category, a dead bookie holding a Pulsar-owned ledger, a silent
bookie, and the demo's Pulsar topics) with its replication worker and Pulsar audit
on; once every check, the risk report and the Pulsar audit have run, Chromium loads
the page (`--dump-dom`, then `--screenshot`), and the test reads the page's text as a
browser shows it. The screenshot is kept in
`test-artifacts/` at the repository's root (`BK_AUDITOR_TEST_ARTIFACTS` elsewhere).
A missing Chromium fails the test: it is never skipped.
"""

from __future__ import annotations

import asyncio
import html
import os
import re
import shutil
from pathlib import Path

import pytest

from auditor.checks.findings import Check
from auditor.checks.owners import owner_of
from auditor.testing.observe import events_of
from auditor.testing.seeded import build_pulsar_topics
from auditor.zk import ZkClient
from tests.integration.test_http_views import PULSAR_CUSTOM, PULSAR_LEDGER, seed, serving, stop_all

ARTIFACTS = Path(
    os.environ.get("BK_AUDITOR_TEST_ARTIFACTS")
    or Path(__file__).resolve().parents[2] / "test-artifacts"
)
WINDOW = "1280,2200"


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail(
            "headless Chromium is needed for this test and was not found on PATH: "
            "`make test` installs Debian's `chromium` package "
            "(or: apt-get install --no-install-recommends chromium)"
        )
    return found


async def run_chromium(profile: Path, *args: str) -> bytes:
    """Chromium as a subprocess (the page's server runs on this test's loop)."""
    proc = await asyncio.create_subprocess_exec(
        chromium(),
        "--headless",
        "--no-sandbox",  # root in containers and CI
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--window-size={WINDOW}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, f"chromium exited {proc.returncode}: {err.decode()[-2000:]}"
    return out


def artefact(name: str) -> Path:
    """A fresh path in the artefacts directory (an older file of that name removed)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    path.unlink(missing_ok=True)
    return path


def visible_text(dom: str) -> str:
    """The page's text as shown: tags and styles gone, entities decoded, blanks folded."""
    dom = re.sub(r"(?is)<(style|head)\b.*?</\1>", " ", dom)
    text = html.unescape(re.sub(r"<[^>]+>", " ", dom))
    return re.sub(r"\s+", " ", text).strip()


async def test_the_page_renders_in_headless_chromium(zk: ZkClient, tmp_path: Path) -> None:
    chromium()  # fail at once, not after the cluster is up
    bookies = await seed(zk)
    await build_pulsar_topics(zk, bookies)
    try:
        extra = ["worker.enabled=true", "pulsar.interval=3600"]
        async with serving(zk, "page-auditor:1", extra) as (daemon, views):
            await asyncio.wait_for(events_of(daemon).risk_reported.wait(), 90)
            pulsar = daemon.state.checks[Check.PULSAR]
            for _ in range(900):
                if pulsar.last_report is not None:
                    break
                await asyncio.sleep(0.1)
            assert pulsar.last_report is not None, pulsar.last_error
            url = f"http://127.0.0.1:{views.port}/"
            dom = (await run_chromium(tmp_path / "profile", "--dump-dom", url)).decode()
            shot = artefact("http_page.png")
            await run_chromium(tmp_path / "profile", f"--screenshot={shot}", url)
        artefact("http_page.html").write_text(dom)

        assert shot.stat().st_size > 10_000, "the screenshot is (nearly) empty"
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        text = visible_text(dom)
        assert re.search(r'id="leader">page-auditor:1<', dom), "the leader is not shown"
        assert "Leader page-auditor:1 (this node)" in text
        # Each check with its last run and age.
        for check in ("bookies", "ledgers", "placement", "replicas", "grace"):
            assert re.search(rf"\b{check} (ok|violations) \d{{4}}-\d\d-\d\dT", text), check
        # Violations by category, with sample ledgers and their Pulsar owners.
        owner = owner_of(PULSAR_CUSTOM)
        assert owner is not None
        lost = re.search(r"bookies ledgers_on_lost_bookies 2 (.*?) (bookies|ledgers) ", text)
        assert lost is not None, text
        assert "3001" in lost.group(1) and f"{PULSAR_LEDGER} ({owner.key})" in lost.group(1)
        assert re.search(r"replicas below_ack_quorum \d+ 3003\b", text), text
        assert re.search(r"placement placement_not_adhering \d+ 3005\b", text), text
        assert 'href="/explain/3003"' in dom
        # The risk summary and the replication worker.
        assert "Risk Last report" in text
        assert re.search(r"Replication worker .*Status running", text), text
        # Its queue by risk: every bucket a row, in order, each with a count.
        queue = (
            r"Marked ledgers by copies left Ranked \S+ Copies left Ledgers Oldest waiting for "
            r"0 \d+ .*1 \d+ .*2 \d+ .*3\+ \d+ .*unknown \d+ "
        )
        assert re.search(queue, text), text
        # The Pulsar audit's rows per namespace: the lost ledger and the orphan in acme/iot.
        assert re.search(r"Pulsar Last audit .*Namespace Ledgers Missing", text), text
        # 4020, 4021 (lost: Pulsar's size) 48 B each, 4022 and the cursor's 4023 open;
        # the system topic's open 4042 and its schema's 4043 (16 B).
        assert re.search(r"acme/iot 6 \(112 B\) 1 \(48 B\) 0 1 \(48 B\)", text), text
        assert "<script" not in dom
    finally:
        await stop_all(bookies)
