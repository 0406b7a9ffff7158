"""Rack resolution from real sources: files, a topology script, Pulsar's `/bookies` znode.

Bookies are registered in a real ZooKeeper (with host names of our choosing,
so that lookups by address and by host are exercised); down bookies are ids
in `host:port` form that are not registered.
"""

from __future__ import annotations

import asyncio
import json
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from auditor.config import load_config
from auditor.errors import ConfigError
from auditor.metadata.registry import register_bookie
from auditor.store import MetadataStore
from auditor.testing.cluster import ClusterWriter
from auditor.topology.racks import RackResolver, RackSourceError, open_rack_resolver
from auditor.topology.script import SCRIPT_OUTPUT_CAP

ROOT = "/ledgers"


async def cluster(store: MetadataStore) -> None:
    await ClusterWriter(store, ROOT).init_cluster()
    # A bookie whose id is not its address, and two plain ones.
    await register_bookie(store, ROOT, "bookie-a", "10.0.0.1", 3181)
    await register_bookie(store, ROOT, "10.0.0.2:3181", "10.0.0.2", 3181)
    await register_bookie(store, ROOT, "10.0.0.3:3181", "10.0.0.3", 3181)


async def resolver(
    store: MetadataStore, *overrides: str, script_timeout: float = 10.0
) -> RackResolver:
    return await open_rack_resolver(
        store, ROOT, load_config(None, overrides), script_timeout=script_timeout
    )


#: The time limit of a script call in the tests that reach it, and the slack allowed past it.
LIMIT = 0.5
MARGIN = 2.0


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text[text.rindex(")") + 2 :].split()


def alive(pid: int) -> bool:
    """Running or sleeping; a zombie (killed, waiting to be reaped) is not alive."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def live_members(pgid: int) -> list[int]:
    """The processes of process group `pgid` that are alive."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                members.append(int(entry.name))
    return members


async def until(done: Callable[[], bool], within: float) -> bool:
    deadline = time.monotonic() + within
    while not done():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def write_script(tmp_path: Path, body: str, name: str = "racks.sh") -> Path:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# --- defaults ---------------------------------------------------------------------


async def test_no_configuration_and_no_znode_knows_nothing(store: MetadataStore) -> None:
    await cluster(store)
    r = await resolver(store)
    assert r.source_names == []
    assert await r.locations(["bookie-a", "10.0.0.9:3181"]) == {}


# --- files ------------------------------------------------------------------------


async def test_json_file_by_id_by_address_and_by_host(store: MetadataStore, tmp_path: Path) -> None:
    await cluster(store)
    f = tmp_path / "racks.json"
    f.write_text(
        json.dumps(
            {
                "10.0.0.1:3181": "/by-address",  # bookie-a's registered address
                "10.0.0.2:3181": "rack-two/",  # by id, normalised
                "10.0.0.3": "/by-host",  # bare host of a registered bookie
                "10.0.0.9:3181": "/down",  # a bookie that is not registered
            }
        )
    )
    r = await resolver(store, f"checks.racks_file={f}")
    assert r.source_names == [f"file:{f}"]
    got = await r.locations(["bookie-a", "10.0.0.2:3181", "10.0.0.3:3181", "10.0.0.9:3181", "x"])
    assert got == {
        "bookie-a": "/by-address",
        "10.0.0.2:3181": "/rack-two",
        "10.0.0.3:3181": "/by-host",
        "10.0.0.9:3181": "/down",
    }
    assert r.source_of("bookie-a") == f"file:{f}"
    assert r.source_of("x") is None


@pytest.mark.parametrize("name", ["racks.yaml", "racks.yml", "RACKS.YAML"])
async def test_yaml_file_is_refused_with_a_pointer_to_json(
    store: MetadataStore, tmp_path: Path, name: str
) -> None:
    """YAML is not read (BookKeeper has no YAML rack format): one line saying to use JSON."""
    await cluster(store)
    f = tmp_path / name
    # Refused by its name, whatever it holds: a flat mapping, nesting, or even JSON.
    for text in ("bookie-a: /r1\n", "racks:\n  bookie-a: /r1\n", '{"bookie-a": "/r1"}'):
        f.write_text(text)
        with pytest.raises(ConfigError) as err:
            await resolver(store, f"checks.racks_file={f}")
        assert str(err.value) == (
            f"racks file {f} is YAML, which is not read: write the same mapping as a JSON "
            'object {"<bookie>": "</rack>"} in a .json file'
        )
    # Refused before it is read: a YAML name that does not exist gets the same line.
    with pytest.raises(ConfigError, match="is YAML, which is not read"):
        await resolver(store, f"checks.racks_file={tmp_path / 'missing.yml'}")


async def test_malformed_files(store: MetadataStore, tmp_path: Path) -> None:
    await cluster(store)
    bad = tmp_path / "bad.json"
    bad.write_text('{"bookie-a": "/r1",}')
    with pytest.raises(RackSourceError, match="is not valid JSON"):
        await resolver(store, f"checks.racks_file={bad}")
    with pytest.raises(ConfigError, match="does not exist"):
        await resolver(store, f"checks.racks_file={tmp_path / 'nope.json'}")


# --- script -----------------------------------------------------------------------

ECHO_RACKS = """echo "$@" >> "$(dirname "$0")/calls.log"
for h in "$@"; do
  case "$h" in
    10.0.0.1) printf '/rack-a ' ;;
    10.0.0.2) printf '/rack-b/ ' ;;
    10.0.0.9) printf '/rack-down ' ;;
    *) printf '/default-rack ' ;;
  esac
done
echo
"""


async def test_script_gets_hosts_in_batches_and_answers_are_cached(
    store: MetadataStore, tmp_path: Path
) -> None:
    await cluster(store)
    script = write_script(tmp_path, ECHO_RACKS)
    r = await resolver(store, f"checks.racks_script={script}", "networkTopologyScriptNumberArgs=2")
    assert r.source_names == [f"script:{script}"]
    bookies = ["bookie-a", "10.0.0.2:3181", "10.0.0.3:3181", "10.0.0.9:3181"]
    got = await r.locations(bookies)
    # One trailing "/" is dropped, as BookKeeper's NodeBase.normalize does.
    assert got == {
        "bookie-a": "/rack-a",
        "10.0.0.2:3181": "/rack-b",
        "10.0.0.3:3181": "/default-rack",
        "10.0.0.9:3181": "/rack-down",
    }
    calls = (tmp_path / "calls.log").read_text().splitlines()
    # The registered address of bookie-a (10.0.0.1), the down bookie's host from its id.
    assert calls == ["10.0.0.1 10.0.0.2", "10.0.0.3 10.0.0.9"]
    # Asked again (and for a new bookie on a known host): no new call.
    await register_bookie(store, ROOT, "bookie-b", "10.0.0.2", 3182)
    assert await r.locations([*bookies, "bookie-b"]) == {**got, "bookie-b": "/rack-b"}
    assert len((tmp_path / "calls.log").read_text().splitlines()) == 2


async def test_bookkeeper_script_key_is_used(store: MetadataStore, tmp_path: Path) -> None:
    await cluster(store)
    script = write_script(tmp_path, ECHO_RACKS)
    r = await resolver(store, f"networkTopologyScriptFileName={script}")
    assert await r.locations(["bookie-a"]) == {"bookie-a": "/rack-a"}


async def test_script_wrong_count_leaves_the_batch_unknown(
    store: MetadataStore, tmp_path: Path
) -> None:
    await cluster(store)
    script = write_script(tmp_path, "echo /only-one\n")
    r = await resolver(store, f"checks.racks_script={script}")
    assert await r.locations(["bookie-a", "10.0.0.2:3181"]) == {}


@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        ("echo oops >&2\nexit 3\n", RackSourceError, "exited with status 3: oops"),
        ("exec sleep 30\n", RackSourceError, "did not finish within 0.5 s"),
        ("printf '\\377\\n'\n", RackSourceError, "non-UTF-8"),
    ],
)
async def test_script_failures_are_typed_errors(
    store: MetadataStore, tmp_path: Path, body: str, error: type[Exception], message: str
) -> None:
    await cluster(store)
    script = write_script(tmp_path, body)
    r = await resolver(store, f"checks.racks_script={script}", script_timeout=0.5)
    with pytest.raises(error, match=message):
        await r.locations(["bookie-a"])


@pytest.mark.parametrize(
    "then",
    ["echo /r1\n", "wait\n"],
    ids=["script-exits", "script-waits-for-its-child"],
)
async def test_script_child_holding_stdout_is_killed_with_the_group_at_the_timeout(
    store: MetadataStore, tmp_path: Path, then: str
) -> None:
    """A child holding the script's stdout cannot hold the check past the limit, nor outlive it.

    Whether the script has exited or waits for the child, end-of-file comes only when
    the child ends: the whole group is killed at the limit.
    """
    await cluster(store)
    script = write_script(
        tmp_path,
        'echo $$ > "$(dirname "$0")/pgid"\n'
        "sleep 600 &\n"  # inherits stdout
        'echo $! > "$(dirname "$0")/child"\n' + then,
    )
    r = await resolver(store, f"checks.racks_script={script}", script_timeout=LIMIT)
    started = time.monotonic()
    with pytest.raises(RackSourceError) as err:
        await r.locations(["bookie-a"])
    elapsed = time.monotonic() - started
    assert str(err.value) == (
        f"rack script {script} did not finish within {LIMIT:g} s (1 host argument(s)); "
        "its process group was killed"
    )
    assert LIMIT <= elapsed < LIMIT + MARGIN
    pgid = int((tmp_path / "pgid").read_text())
    child = int((tmp_path / "child").read_text())
    assert await until(lambda: not live_members(pgid), MARGIN), live_members(pgid)
    assert not alive(child)


async def test_script_output_is_capped_at_one_mebibyte(
    store: MetadataStore, tmp_path: Path
) -> None:
    await cluster(store)
    assert SCRIPT_OUTPUT_CAP == 1024 * 1024
    # Exactly the cap (a location of cap - 1 characters and its newline) is read.
    body = "printf /; head -c {n} /dev/zero | tr '\\0' a; echo\n"
    exact = write_script(tmp_path, body.format(n=SCRIPT_OUTPUT_CAP - 2), "exact.sh")
    r = await resolver(store, f"checks.racks_script={exact}")
    assert await r.locations(["bookie-a"]) == {"bookie-a": "/" + "a" * (SCRIPT_OUTPUT_CAP - 2)}
    # One byte more is refused.
    over = write_script(tmp_path, body.format(n=SCRIPT_OUTPUT_CAP - 1), "over.sh")
    r = await resolver(store, f"checks.racks_script={over}")
    with pytest.raises(RackSourceError) as err:
        await r.locations(["bookie-a"])
    assert str(err.value) == (
        f"rack script {over} printed more than {SCRIPT_OUTPUT_CAP} bytes (1 host argument(s)); "
        "its process group was killed"
    )


async def test_endless_output_is_cut_at_the_cap_and_the_group_killed(
    store: MetadataStore, tmp_path: Path
) -> None:
    await cluster(store)
    script = write_script(tmp_path, 'echo $$ > "$(dirname "$0")/pgid"\nexec yes /rack-a\n')
    r = await resolver(store, f"checks.racks_script={script}", script_timeout=600)
    started = time.monotonic()
    with pytest.raises(RackSourceError, match=f"printed more than {SCRIPT_OUTPUT_CAP} bytes"):
        await r.locations(["bookie-a"])
    # Refused when the cap is reached, not at the time limit.
    assert time.monotonic() - started < MARGIN
    pgid = int((tmp_path / "pgid").read_text())
    assert await until(lambda: not live_members(pgid), MARGIN), live_members(pgid)


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ("/rack-a\nrack-b\n", "line 2: location 'rack-b' does not start with /"),
        ("/rack-a /\n", "line 1: location '/' names the root, not a rack"),
        ("/rack-a\n/r//b\n", "line 2: location '/r//b' has an empty level"),
        (
            "/rack-a\n/region/rack-b\n",
            "line 2: location '/region/rack-b' has 2 level(s) where its other locations have 1 "
            "(BookKeeper's topology keeps every bookie at one depth)",
        ),
    ],
)
async def test_invalid_location_names_the_script_and_the_line(
    store: MetadataStore, tmp_path: Path, output: str, message: str
) -> None:
    await cluster(store)
    script = write_script(tmp_path, f"printf '{output}'\n")
    r = await resolver(store, f"checks.racks_script={script}")
    with pytest.raises(RackSourceError) as err:
        await r.locations(["bookie-a", "10.0.0.2:3181"])
    assert str(err.value) == f"rack script {script} {message}"


async def test_locations_keep_one_depth_across_calls(store: MetadataStore, tmp_path: Path) -> None:
    """One host per call: the second call's deeper location is refused like a bad one."""
    await cluster(store)
    body = 'case "$1" in 10.0.0.1) echo /rack-a ;; *) echo /region/rack-b ;; esac\n'
    script = write_script(tmp_path, body)
    r = await resolver(store, f"checks.racks_script={script}", "networkTopologyScriptNumberArgs=1")
    assert await r.locations(["bookie-a"]) == {"bookie-a": "/rack-a"}
    with pytest.raises(RackSourceError) as err:
        await r.locations(["10.0.0.2:3181"])
    assert str(err.value) == (
        f"rack script {script} line 1: location '/region/rack-b' has 2 level(s) where its "
        "other locations have 1 (BookKeeper's topology keeps every bookie at one depth)"
    )


async def test_cancelled_lookup_kills_the_script_group(
    store: MetadataStore, tmp_path: Path
) -> None:
    """A check cancelled mid-call (a leader stepping down) leaves no script process behind."""
    await cluster(store)
    script = write_script(
        tmp_path,
        'echo $$ > "$(dirname "$0")/pgid.tmp"\n'
        'mv "$(dirname "$0")/pgid.tmp" "$(dirname "$0")/pgid"\n'
        "exec sleep 600\n",
    )
    r = await resolver(store, f"checks.racks_script={script}", script_timeout=600)
    task = asyncio.create_task(r.locations(["bookie-a"]))
    pgid_file = tmp_path / "pgid"
    assert await until(pgid_file.exists, 30)
    pgid = int(pgid_file.read_text())
    assert await until(lambda: bool(live_members(pgid)), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await until(lambda: not live_members(pgid), MARGIN), live_members(pgid)


async def test_script_that_cannot_run_is_a_config_error(
    store: MetadataStore, tmp_path: Path
) -> None:
    await cluster(store)
    with pytest.raises(ConfigError, match="does not exist"):
        await resolver(store, f"checks.racks_script={tmp_path / 'missing.sh'}")
    plain = tmp_path / "plain.sh"
    plain.write_text("echo /r1\n")
    with pytest.raises(ConfigError, match="not executable"):
        await resolver(store, f"checks.racks_script={plain}")


# --- Pulsar's /bookies znode ------------------------------------------------------

PULSAR = {
    "default": {
        "10.0.0.2:3181": {"rack": "/pulsar-two", "hostname": "bk2.example"},
        "10.0.0.1:3181": {"rack": "pulsar-a"},  # bookie-a's address, no leading "/"
        "10.0.0.3:3181": {"rack": "", "hostname": "bk3.example"},  # empty: unknown
    },
    "other": {"10.0.0.9:3181": {"rack": "/pulsar-down/"}},
}


async def test_pulsar_znode(store: MetadataStore) -> None:
    await cluster(store)
    await store.create("/bookies", json.dumps(PULSAR).encode())
    r = await resolver(store)
    assert r.source_names == ["znode:/bookies"]
    got = await r.locations(["bookie-a", "10.0.0.2:3181", "10.0.0.3:3181", "10.0.0.9:3181"])
    assert got == {
        "bookie-a": "/pulsar-a",
        "10.0.0.2:3181": "/pulsar-two",
        "10.0.0.9:3181": "/pulsar-down",
    }


async def test_pulsar_znode_custom_path_and_disabled(store: MetadataStore) -> None:
    await cluster(store)
    await store.create("/pulsar/bookies", json.dumps(PULSAR).encode(), makepath=True)
    r = await resolver(store, "checks.racks_znode=/pulsar/bookies")
    assert await r.locations(["10.0.0.2:3181"]) == {"10.0.0.2:3181": "/pulsar-two"}
    await store.create("/bookies", json.dumps(PULSAR).encode())
    off = await resolver(store, "checks.racks_znode=")
    assert off.source_names == []
    with pytest.raises(ConfigError, match="absolute"):
        await resolver(store, "checks.racks_znode=bookies")


async def test_malformed_pulsar_znode(store: MetadataStore) -> None:
    await cluster(store)
    await store.create("/bookies", b'{"default": {"10.0.0.2:3181": "/r1"}}')
    with pytest.raises(RackSourceError, match="must be an object"):
        await resolver(store)


# --- precedence -------------------------------------------------------------------


async def test_file_takes_precedence_over_script_and_znode(
    store: MetadataStore, tmp_path: Path
) -> None:
    """Per bookie, the first source that knows it wins: file, then script, then znode."""
    await cluster(store)
    await store.create("/bookies", json.dumps(PULSAR).encode())
    f = tmp_path / "racks.json"
    f.write_text(json.dumps({"10.0.0.2:3181": "/from-file"}))
    script = write_script(tmp_path, ECHO_RACKS)
    r = await resolver(store, f"checks.racks_file={f}", f"checks.racks_script={script}")
    assert r.source_names == [f"file:{f}", f"script:{script}", "znode:/bookies"]
    got = await r.locations(["10.0.0.2:3181", "bookie-a", "10.0.0.3:3181"])
    # The script answers every host it is given (a valid location each, or the call fails).
    assert got == {
        "10.0.0.2:3181": "/from-file",
        "bookie-a": "/rack-a",
        "10.0.0.3:3181": "/default-rack",
    }
    assert r.source_of("10.0.0.2:3181") == f"file:{f}"
    assert r.source_of("bookie-a") == f"script:{script}"
    assert r.source_of("10.0.0.3:3181") == f"script:{script}"
    # The file alone over the znode: the znode fills in what the file does not know.
    r2 = await resolver(store, f"checks.racks_file={f}")
    assert await r2.locations(["10.0.0.2:3181", "bookie-a"]) == {
        "10.0.0.2:3181": "/from-file",
        "bookie-a": "/pulsar-a",
    }
