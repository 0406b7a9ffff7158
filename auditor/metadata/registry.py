"""Whether a bookie is lost, where to reach it and which bookies ever existed are asked by
every check and by the worker, of znodes whose shape BookKeeper fixes; they are read in one
place, with one rule of what "available" means.

The bookie registry: who is writable, who is read-only, who ever existed.

Bookies announce themselves with ephemeral znodes `available/<id>` (writable)
and `available/readonly/<id>` (read-only), whose data is a binary
BookieServiceInfoFormat (empty for bookies older than 4.12), and leave a
persistent cookie under `cookies/<id>`. The auditor counts writable plus
read-only as available (a read-only bookie still serves reads, so it is never
"lost"), and reads addresses from the registration, falling back to the id
itself when it has the `host:port` form.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from auditor.metadata.records import (
    CURRENT_COOKIE_LAYOUT_VERSION,
    BookieServiceInfo,
    Cookie,
    Endpoint,
    RecordFormatError,
    decode_bookie_service_info,
    encode_bookie_service_info,
    encode_cookie,
)
from auditor.store import MetadataStore, NodeExistsError, NoNodeError

READONLY = "readonly"


@dataclass(frozen=True, slots=True)
class BookieSet:
    writable: frozenset[str]
    readonly: frozenset[str]

    @property
    def available(self) -> frozenset[str]:
        return self.writable | self.readonly


def available_path(root: str, bookie_id: str, *, readonly: bool = False) -> str:
    return (
        f"{root}/available/{READONLY}/{bookie_id}" if readonly else f"{root}/available/{bookie_id}"
    )


def cookie_path(root: str, bookie_id: str) -> str:
    return f"{root}/cookies/{bookie_id}"


def service_info_bytes(host: str, port: int, *, tls: bool = False) -> bytes:
    """Registration data as a current bookie publishes it (one bookie-rpc endpoint).

    A bookie with TLS configured lists the extension `tls` on that endpoint.
    """
    endpoint = Endpoint(
        id="bookie",
        port=port,
        host=host,
        protocol="bookie-rpc",
        extensions=("tls",) if tls else (),
    )
    return encode_bookie_service_info(BookieServiceInfo((endpoint,)))


def cookie_bytes(bookie_id: str, instance_id: str | None = None) -> bytes:
    """A version-5 cookie, as BookKeeper writes one (TextFormat after the version line)."""
    return encode_cookie(
        Cookie(
            layout_version=CURRENT_COOKIE_LAYOUT_VERSION,
            bookie_id=bookie_id,
            journal_dirs="/data/bookkeeper/journal",
            ledger_dirs="1\t/data/bookkeeper/ledgers",
            instance_id=instance_id,
        )
    )


def address_from_service_info(data: bytes) -> tuple[str, int] | None:
    """The bookie-rpc endpoint of a registration, or None (legacy empty data, or garbage)."""
    if not data:
        return None
    try:
        ep = decode_bookie_service_info(data).endpoint("bookie-rpc")
    except RecordFormatError:
        return None
    if ep is None or not ep.host or not 0 < ep.port < 65536:
        return None
    return ep.host, ep.port


def address_from_id(bookie_id: str) -> tuple[str, int] | None:
    host, sep, port = bookie_id.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or ":" in host:
        return None
    p = int(port)
    return (host, p) if 0 < p < 65536 else None


async def _children(store: MetadataStore, path: str) -> list[str]:
    try:
        return await store.get_children(path)
    except NoNodeError:
        return []


async def read_bookies(store: MetadataStore, root: str) -> BookieSet:
    writable, readonly = await asyncio.gather(
        _children(store, f"{root}/available"), _children(store, f"{root}/available/{READONLY}")
    )
    return BookieSet(frozenset(b for b in writable if b != READONLY), frozenset(readonly))


async def all_known_bookies(store: MetadataStore, root: str) -> frozenset[str]:
    """Every bookie that ever registered (its cookie survives it)."""
    return frozenset(await _children(store, f"{root}/cookies"))


async def resolve_bookie(store: MetadataStore, root: str, bookie_id: str) -> tuple[str, int] | None:
    for readonly in (False, True):
        try:
            data, _ = await store.get(available_path(root, bookie_id, readonly=readonly))
        except NoNodeError:
            continue
        addr = address_from_service_info(data)
        if addr is not None:
            return addr
        break
    return address_from_id(bookie_id)


async def register_bookie(
    store: MetadataStore,
    root: str,
    bookie_id: str,
    host: str,
    port: int,
    *,
    readonly: bool = False,
    tls: bool = False,
) -> None:
    """Registers as a bookie does: cookie first (persistent), then the ephemeral node.

    Going read-only creates the read-only node before deleting the writable
    one, as BookKeeper does, so the bookie is never missing from both.
    """
    with contextlib.suppress(NodeExistsError):
        await store.create(cookie_path(root, bookie_id), cookie_bytes(bookie_id), makepath=True)
    data = service_info_bytes(host, port, tls=tls)
    await store.ensure_path(f"{root}/available/{READONLY}")
    try:
        await store.create(available_path(root, bookie_id, readonly=readonly), data, ephemeral=True)
    except NodeExistsError:
        await store.set(available_path(root, bookie_id, readonly=readonly), data)
    with contextlib.suppress(NoNodeError):
        await store.delete(available_path(root, bookie_id, readonly=not readonly))


async def unregister_bookie(store: MetadataStore, root: str, bookie_id: str) -> None:
    for readonly in (False, True):
        with contextlib.suppress(NoNodeError):
            await store.delete(available_path(root, bookie_id, readonly=readonly))


async def watch_bookies(store: MetadataStore, root: str) -> AsyncGenerator[BookieSet, None]:
    """The current bookie set, then each changed set as bookies come and go.

    Built on one-shot child watches re-armed after every change, so no change
    between two reads is lost: a change that lands while we re-read simply
    fires the freshly set watch.
    """
    await store.ensure_path(f"{root}/available/{READONLY}")
    last: BookieSet | None = None
    while True:
        (w, w_changed), (r, r_changed) = await asyncio.gather(
            store.get_children_watched(f"{root}/available"),
            store.get_children_watched(f"{root}/available/{READONLY}"),
        )
        current = BookieSet(frozenset(b for b in w if b != READONLY), frozenset(r))
        if current != last:
            last = current
            yield current
        waiters = [asyncio.ensure_future(w_changed.wait()), asyncio.ensure_future(r_changed.wait())]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in waiters:
                t.cancel()
