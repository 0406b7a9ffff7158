"""The placement check (judging ensembles) and whatever chooses bookies by location
(what-if, a replication worker's replacement choice) must read a location exactly as
BookKeeper's placement policies do, or one would refuse what the other chose.

Network locations as BookKeeper writes them: `/rack`, `/region/rack`, `/zone/upgradedomain`.

Here: the default locations each policy gives an unknown bookie, the normal form of
a location, and how the region-aware and zone-aware policies read one.
"""

from __future__ import annotations

DEFAULT_RACK = "/default-rack"
DEFAULT_REGION = "/default-region"
DEFAULT_REGION_RACK = "/default-region/default-rack"
DEFAULT_ZONE = "/default-zone"
DEFAULT_UPGRADE_DOMAIN = "/default-upgradedomain"
DEFAULT_ZONE_UPGRADE_DOMAIN = DEFAULT_ZONE + DEFAULT_UPGRADE_DOMAIN


def normalize_location(raw: str) -> str | None:
    """A location in BookKeeper's normal form, or None when it says nothing.

    Trailing slashes and whitespace go together, however they interleave
    (`"r1 /"` is `/r1`): stripping one and then the other could leave the
    other at the end, and the result would not be in normal form.
    """
    text = raw.strip()
    end = len(text)
    while end and (text[end - 1] == "/" or text[end - 1].isspace()):
        end -= 1
    text = text[:end]
    if not text:
        return None
    return text if text.startswith("/") else "/" + text


class InvalidLocationError(ValueError):
    """A location BookKeeper's NetworkTopology would not take; the message says why."""


def topology_location(raw: str) -> str:
    """`raw` as BookKeeper's network topology takes it, normalised; else InvalidLocationError.

    The rule of upstream's `NodeBase.normalize` and `NetworkTopologyImpl.add`
    (bookkeeper-server, `org.apache.bookkeeper.net`), written out here:

    * a location starts with `/` (`NodeBase.normalize` throws otherwise), and
      one trailing `/` is dropped (the same method);
    * what is left names at least one level: `/` alone is the root, and
      `NetworkTopologyImpl.add` cannot hang a bookie there (`InnerNode.add`
      fails on a leaf whose location is the root);
    * no level is empty: `/a//b` would give the tree a nameless inner node,
      a place no operator means and that prints almost like `/a/b`.

    Used where a source hands us locations BookKeeper itself would be given
    verbatim (the topology script); the mapping file and Pulsar's znode keep
    their lenient `normalize_location` (a missing leading `/` is added).
    Leaves of one topology must also sit at one depth; that rule spans
    several locations and is checked by the caller (`location_depth`).
    """
    if not raw.startswith("/"):
        raise InvalidLocationError("does not start with /")
    text = raw[:-1] if raw.endswith("/") else raw
    if not text:
        raise InvalidLocationError("names the root, not a rack")
    if "" in text[1:].split("/"):
        raise InvalidLocationError("has an empty level")
    return text


def location_depth(location: str) -> int:
    """Levels of a valid topology location: `/rack` is 1, `/region/rack` 2."""
    return location.count("/")


def region_of(location: str) -> str | None:
    """The region of a `/region/rack` location, or None when it names no known region."""
    parts = [p for p in location.split("/") if p]
    if not parts or location == DEFAULT_RACK or "/" + parts[0] == DEFAULT_REGION:
        return None
    return parts[0]


def zone_and_domain(location: str) -> tuple[str, str] | None:
    """`(zone, upgrade domain)`, or None for an unresolved zone-aware location."""
    if location == DEFAULT_ZONE_UPGRADE_DOMAIN:
        return None
    parts = location.split("/")
    if len(parts) != 3 or parts[0] or not parts[1] or not parts[2]:
        return None
    return parts[1], parts[2]
