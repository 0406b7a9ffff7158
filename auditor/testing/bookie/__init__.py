"""Tests and the demo need bookies the auditor reaches exactly as it reaches production ones,
that hold big clusters cheaply and break on demand; a mock of the client would hide the
very mistakes on the wire these tests are for.

A bookie emulator that speaks BookKeeper's real v3 protocol over TCP.

Its bookies are resolved through their ZooKeeper registration, reached over TCP
with v3 frames, and answer with the statuses a real bookie uses (including its
quirks: READ_LAC's ENOENTRY for an unknown ledger, and DbLedgerStorage's
silence on list requests for ledgers it holds). So this is a protocol
emulator, not a mock of the client: anything the client gets wrong on the
wire shows up here as it would against a bookie. Its answers are compared
field by field with a real BookKeeper 4.17.2 bookie's of each ledger storage
(`Storage`) in tests/interop/test_conformance.py.

It also has to build big clusters cheaply and break on demand:

* Ledgers can be seeded directly (`put_ledger`) as ranges with a body
  factory; nothing is materialised per entry, bodies are generated when
  read. Entries written over the wire (ADD_ENTRY) are kept byte for byte.
* Faults: drop entries or ledgers, turn read-only, pause (hold every request
  with connections left open), add latency, answer with a chosen status,
  crash (close everything, unregister) and restart with the same id and data.
  Corruption, for the deep scrub: a stored entry's bit flipped (`corrupt_entry`),
  an entry listed but unreadable (`make_unreadable`: EIO), a copy that differs
  from the others with a valid digest (`diverge_entry`).
* Counters (requests received per operation, requests in flight and their
  maximum, connections accepted, list requests per ledger, plain and recovery
  adds per ledger) let tests assert
  what the client did; `stats()` is all of them as one JSON-able dict.
* A bookie in a process of its own (`run_emulator`, benchmarks) is seeded
  from a compact file (`write_seed_file`) rather than over the wire, and
  writes its counters to a file on SIGUSR1 (SIGUSR2 resets them first) and
  when it stops, so whoever started it can count what a client sent.

TLS works as on a bookie with `tlsProviderFactoryClass`: given a server
context (`tls`), START_TLS is answered EOK in clear and the same connection
then turns into a TLS server; without one it is answered EBADREQ. With
`tls_required` the emulator acts like a bookie whose authentication plugin
only accepts TLS connections (BookieAuthZFactory): until a connection has
finished its handshake every request but START_TLS gets a bodiless EUA
carrying the request's header. A context that wants client certificates
(`verify_mode = CERT_REQUIRED`, `tlsClientAuthentication` on a bookie) fails
the handshake of a client that presents none. START_TLS is handled on the
spot, untouched by latency and injected statuses; a pause holds it like any
request. Handshakes completed and failed are counted; each peer knows its
cipher and the client certificate it was shown.

Like a bookie, a frame that is not a valid v3 `Request` ends the connection.
Requests are handled inline unless latency or a pause defers them, so answers
to delayed requests leave in whatever order their delays end, the way a
bookie's per-ledger thread pools reorder them.

The package, by seam:

* `emulator` - `BookieEmulator`: lifecycle and ZooKeeper registration, the
  fault switches, the data API, counters, and the request path (receive,
  delay, hold, answer);
* `peer` - one client connection: framing and the START_TLS upgrade;
* `handlers` - what each operation does to the storage and answers;
* `replies` - answers worded as a bookie words them;
* `storage` - ledgers as seeded runs and received bodies, body factories,
  and which ledger storage is imitated;
* `faults` - the latency and injected-status table;
* `seedfile` - the compact seed file format;
* `process` - `run_emulator`, a bookie in a process of its own.

Everything a caller needs is imported from here.
"""

from auditor.testing.bookie.emulator import BookieEmulator
from auditor.testing.bookie.faults import Latency
from auditor.testing.bookie.process import run_emulator
from auditor.testing.bookie.seedfile import (
    SEED_MAGIC,
    SeedFileError,
    read_seed_file,
    write_seed_file,
)
from auditor.testing.bookie.storage import BodyFactory, Storage, default_body, make_body_factory

__all__ = [
    "SEED_MAGIC",
    "BodyFactory",
    "BookieEmulator",
    "Latency",
    "SeedFileError",
    "Storage",
    "default_body",
    "make_body_factory",
    "read_seed_file",
    "run_emulator",
    "write_seed_file",
]
