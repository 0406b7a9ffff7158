"""One BookieId rule: what BookKeeper's `BookieId.parse` accepts, and the address in one.

The rule is `auditor.metadata.serde.is_valid_bookie_id`; ledger ensembles and
the daemon's election identity are both held to it. A bookie id of the
`host:port` form names an address (`address_from_id`), and only with a port
BookKeeper could have written: ASCII digits, 1..65535. Ids reach that parser
from znode names (`available/`, `cookies/`) and racks files, so a name no
bookie could have must come back as "no address", never as an exception.
"""

from __future__ import annotations

import pytest

from auditor.daemon.config import validate_identity
from auditor.errors import ConfigError
from auditor.metadata.registry import address_from_id
from auditor.metadata.serde import is_valid_bookie_id

VALID = ["test", "1.2.3.4:1234", "this.is.an.hostname:1234", "a_b@c[d]", "x;y<z>?^", "bk-1:3181"]
INVALID = ["non valid", "non$valid", "readonly", "ReadOnly", "", "a/b", "h:٣١٨١", "é:1"]


@pytest.mark.parametrize("bookie_id", VALID)
def test_the_identity_and_the_ensembles_accept_the_same_ids(bookie_id: str) -> None:
    assert is_valid_bookie_id(bookie_id)
    assert validate_identity(bookie_id) == bookie_id


@pytest.mark.parametrize("bookie_id", INVALID)
def test_the_identity_and_the_ensembles_refuse_the_same_ids(bookie_id: str) -> None:
    assert not is_valid_bookie_id(bookie_id)
    with pytest.raises(ConfigError, match=r"^daemon\.identity"):
        validate_identity(bookie_id)


@pytest.mark.parametrize(
    ("bookie_id", "address"),
    [
        ("10.0.0.1:3181", ("10.0.0.1", 3181)),
        ("bk-1.example:65535", ("bk-1.example", 65535)),
        ("bk-1", None),
        ("bk-1:", None),
        (":3181", None),
        ("bk-1:0", None),
        ("bk-1:65536", None),
        ("::1:3181", None),
        # Digits to Python's str.isdigit, not to BookKeeper: no address, no exception.
        ("bk-1:²", None),
        ("bk-1:٣١٨١", None),
    ],
)
def test_an_address_only_from_a_host_and_a_real_port(
    bookie_id: str, address: tuple[str, int] | None
) -> None:
    assert address_from_id(bookie_id) == address
