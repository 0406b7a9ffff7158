"""Rack resolution from real sources: files, a topology script, Pulsar's `/bookies` znode.

Bookies are registered in a real ZooKeeper (with host names of our choosing,
so that lookups by address and by host are exercised); down bookies are ids
in `host:port` form that are not registered.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from auditor.config import load_config
from auditor.errors import ConfigError
from auditor.metadata.registry import register_bookie
from auditor.testing.cluster import ClusterWriter
from auditor.topology.racks import RackResolver, RackSourceError, open_rack_resolver
from auditor.zk import ZkClient

ROOT = "/ledgers"


async def cluster(zk: ZkClient) -> None:
    await ClusterWriter(zk, ROOT).init_cluster()
    # A bookie whose id is not its address, and two plain ones.
    await register_bookie(zk, ROOT, "bookie-a", "10.0.0.1", 3181)
    await register_bookie(zk, ROOT, "10.0.0.2:3181", "10.0.0.2", 3181)
    await register_bookie(zk, ROOT, "10.0.0.3:3181", "10.0.0.3", 3181)


async def resolver(zk: ZkClient, *overrides: str, script_timeout: float = 10.0) -> RackResolver:
    return await open_rack_resolver(
        zk, ROOT, load_config(None, overrides), script_timeout=script_timeout
    )


def write_script(tmp_path: Path, body: str, name: str = "racks.sh") -> Path:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# --- defaults ---------------------------------------------------------------------


async def test_no_configuration_and_no_znode_knows_nothing(zk: ZkClient) -> None:
    await cluster(zk)
    r = await resolver(zk)
    assert r.source_names == []
    assert await r.locations(["bookie-a", "10.0.0.9:3181"]) == {}


# --- files ------------------------------------------------------------------------


async def test_json_file_by_id_by_address_and_by_host(zk: ZkClient, tmp_path: Path) -> None:
    await cluster(zk)
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
    r = await resolver(zk, f"checks.racks_file={f}")
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


async def test_yaml_file(zk: ZkClient, tmp_path: Path) -> None:
    await cluster(zk)
    f = tmp_path / "racks.yaml"
    f.write_text("# racks\nbookie-a: /r1\n'10.0.0.2:3181': r2\n")
    r = await resolver(zk, f"checks.racks_file={f}")
    assert await r.locations(["bookie-a", "10.0.0.2:3181"]) == {
        "bookie-a": "/r1",
        "10.0.0.2:3181": "/r2",
    }


async def test_malformed_files(zk: ZkClient, tmp_path: Path) -> None:
    await cluster(zk)
    bad = tmp_path / "bad.json"
    bad.write_text('{"bookie-a": "/r1",}')
    with pytest.raises(RackSourceError, match="is not valid JSON"):
        await resolver(zk, f"checks.racks_file={bad}")
    nested = tmp_path / "nested.yml"
    nested.write_text("racks:\n  bookie-a: /r1\n")
    with pytest.raises(RackSourceError, match="nested YAML"):
        await resolver(zk, f"checks.racks_file={nested}")
    with pytest.raises(ConfigError, match="does not exist"):
        await resolver(zk, f"checks.racks_file={tmp_path / 'nope.json'}")


# --- script -----------------------------------------------------------------------

ECHO_RACKS = """echo "$@" >> "$(dirname "$0")/calls.log"
for h in "$@"; do
  case "$h" in
    10.0.0.1) printf '/rack-a ' ;;
    10.0.0.2) printf 'rack-b/ ' ;;
    10.0.0.9) printf '/rack-down ' ;;
    *) printf '/ ' ;;
  esac
done
echo
"""


async def test_script_gets_hosts_in_batches_and_answers_are_cached(
    zk: ZkClient, tmp_path: Path
) -> None:
    await cluster(zk)
    script = write_script(tmp_path, ECHO_RACKS)
    r = await resolver(zk, f"checks.racks_script={script}", "networkTopologyScriptNumberArgs=2")
    assert r.source_names == [f"script:{script}"]
    bookies = ["bookie-a", "10.0.0.2:3181", "10.0.0.3:3181", "10.0.0.9:3181"]
    got = await r.locations(bookies)
    # "/" is no answer: 10.0.0.3 is left to the policy's default.
    assert got == {"bookie-a": "/rack-a", "10.0.0.2:3181": "/rack-b", "10.0.0.9:3181": "/rack-down"}
    calls = (tmp_path / "calls.log").read_text().splitlines()
    # The registered address of bookie-a (10.0.0.1), the down bookie's host from its id.
    assert calls == ["10.0.0.1 10.0.0.2", "10.0.0.3 10.0.0.9"]
    # Asked again (and for a new bookie on a known host): no new call.
    await register_bookie(zk, ROOT, "bookie-b", "10.0.0.2", 3182)
    assert await r.locations([*bookies, "bookie-b"]) == {**got, "bookie-b": "/rack-b"}
    assert len((tmp_path / "calls.log").read_text().splitlines()) == 2


async def test_bookkeeper_script_key_is_used(zk: ZkClient, tmp_path: Path) -> None:
    await cluster(zk)
    script = write_script(tmp_path, ECHO_RACKS)
    r = await resolver(zk, f"networkTopologyScriptFileName={script}")
    assert await r.locations(["bookie-a"]) == {"bookie-a": "/rack-a"}


async def test_script_wrong_count_leaves_the_batch_unknown(zk: ZkClient, tmp_path: Path) -> None:
    await cluster(zk)
    script = write_script(tmp_path, "echo /only-one\n")
    r = await resolver(zk, f"checks.racks_script={script}")
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
    zk: ZkClient, tmp_path: Path, body: str, error: type[Exception], message: str
) -> None:
    await cluster(zk)
    script = write_script(tmp_path, body)
    r = await resolver(zk, f"checks.racks_script={script}", script_timeout=0.5)
    with pytest.raises(error, match=message):
        await r.locations(["bookie-a"])


async def test_script_that_cannot_run_is_a_config_error(zk: ZkClient, tmp_path: Path) -> None:
    await cluster(zk)
    with pytest.raises(ConfigError, match="does not exist"):
        await resolver(zk, f"checks.racks_script={tmp_path / 'missing.sh'}")
    plain = tmp_path / "plain.sh"
    plain.write_text("echo /r1\n")
    with pytest.raises(ConfigError, match="not executable"):
        await resolver(zk, f"checks.racks_script={plain}")


# --- Pulsar's /bookies znode ------------------------------------------------------

PULSAR = {
    "default": {
        "10.0.0.2:3181": {"rack": "/pulsar-two", "hostname": "bk2.example"},
        "10.0.0.1:3181": {"rack": "pulsar-a"},  # bookie-a's address, no leading "/"
        "10.0.0.3:3181": {"rack": "", "hostname": "bk3.example"},  # empty: unknown
    },
    "other": {"10.0.0.9:3181": {"rack": "/pulsar-down/"}},
}


async def test_pulsar_znode(zk: ZkClient) -> None:
    await cluster(zk)
    await zk.create("/bookies", json.dumps(PULSAR).encode())
    r = await resolver(zk)
    assert r.source_names == ["znode:/bookies"]
    got = await r.locations(["bookie-a", "10.0.0.2:3181", "10.0.0.3:3181", "10.0.0.9:3181"])
    assert got == {
        "bookie-a": "/pulsar-a",
        "10.0.0.2:3181": "/pulsar-two",
        "10.0.0.9:3181": "/pulsar-down",
    }


async def test_pulsar_znode_custom_path_and_disabled(zk: ZkClient) -> None:
    await cluster(zk)
    await zk.create("/pulsar/bookies", json.dumps(PULSAR).encode(), makepath=True)
    r = await resolver(zk, "checks.racks_znode=/pulsar/bookies")
    assert await r.locations(["10.0.0.2:3181"]) == {"10.0.0.2:3181": "/pulsar-two"}
    await zk.create("/bookies", json.dumps(PULSAR).encode())
    off = await resolver(zk, "checks.racks_znode=")
    assert off.source_names == []
    with pytest.raises(ConfigError, match="absolute"):
        await resolver(zk, "checks.racks_znode=bookies")


async def test_malformed_pulsar_znode(zk: ZkClient) -> None:
    await cluster(zk)
    await zk.create("/bookies", b'{"default": {"10.0.0.2:3181": "/r1"}}')
    with pytest.raises(RackSourceError, match="must be an object"):
        await resolver(zk)


# --- precedence -------------------------------------------------------------------


async def test_file_takes_precedence_over_script_and_znode(zk: ZkClient, tmp_path: Path) -> None:
    """Per bookie, the first source that knows it wins: file, then script, then znode."""
    await cluster(zk)
    await zk.create("/bookies", json.dumps(PULSAR).encode())
    f = tmp_path / "racks.json"
    f.write_text(json.dumps({"10.0.0.2:3181": "/from-file"}))
    script = write_script(tmp_path, ECHO_RACKS)
    r = await resolver(zk, f"checks.racks_file={f}", f"checks.racks_script={script}")
    assert r.source_names == [f"file:{f}", f"script:{script}", "znode:/bookies"]
    got = await r.locations(["10.0.0.2:3181", "bookie-a", "10.0.0.3:3181"])
    assert got == {"10.0.0.2:3181": "/from-file", "bookie-a": "/rack-a"}
    assert r.source_of("10.0.0.2:3181") == f"file:{f}"
    assert r.source_of("bookie-a") == f"script:{script}"
    # The file alone over the znode: the znode fills in what the file does not know.
    r2 = await resolver(zk, f"checks.racks_file={f}")
    assert await r2.locations(["10.0.0.2:3181", "bookie-a"]) == {
        "10.0.0.2:3181": "/from-file",
        "bookie-a": "/pulsar-a",
    }
