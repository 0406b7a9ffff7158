"""What every fuzz test shares: settings, a CPU-time bound per call, mutations, a memory probe."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from datetime import timedelta
from types import FrameType

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

#: Multiplies every test's example count: FUZZ_SCALE=20 for a long local run.
SCALE = float(os.environ.get("FUZZ_SCALE", "1"))

#: CPU seconds one call may use on fuzzing-sized inputs before it counts as a hang.
CPU_LIMIT = 5.0

#: Peak bytes a parser may allocate for a crafted input of a few KB claiming a huge length.
ALLOCATION_LIMIT = 2 * 1024 * 1024


def fuzz_settings(max_examples: int) -> settings:
    """Settings for one fuzz test: `max_examples` scaled by FUZZ_SCALE.

    The deadline is generous because the suite shares the machine with other
    work: a parser that is slow on a few KB is caught, a busy CPU is not
    mistaken for one. Hangs that never return are cut by `cpu_limit`.
    """
    return settings(
        max_examples=max(1, round(max_examples * SCALE)),
        deadline=timedelta(seconds=2),
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
    )


class Hang(Exception):
    """A call used more CPU time than `cpu_limit` allows."""


@contextlib.contextmanager
def cpu_limit(seconds: float = CPU_LIMIT) -> Iterator[None]:
    """Raises `Hang` inside the block once it has used `seconds` of CPU time.

    It counts CPU time (ITIMER_VIRTUAL), not wall time, so a loaded machine
    does not trip it, and it leaves SIGALRM to pytest-timeout. A parser that
    catches every Exception would turn the Hang into its typed error, so the
    Hang is raised again when the block ends. Outside the main thread, where
    signals cannot be handled, it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[bool] = []

    def on_timer(signum: int, frame: FrameType | None) -> None:
        fired.append(True)
        raise Hang(f"more than {seconds} s of CPU time")

    previous = signal.signal(signal.SIGVTALRM, on_timer)
    signal.setitimer(signal.ITIMER_VIRTUAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, previous)
    if fired:
        raise Hang(f"more than {seconds} s of CPU time (the Hang was swallowed)")


def run(target: Callable[[bytes], None], data: bytes) -> None:
    """One fuzz call: `target(data)` under the CPU bound."""
    with cpu_limit():
        target(data)


def peak_allocation(call: Callable[[], object]) -> int:
    """Peak bytes traced by tracemalloc while `call` runs (its exceptions are swallowed).

    The caller asserts what `call` raised separately; this only measures.
    """
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        with contextlib.suppress(Exception):
            call()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        if not was_tracing:
            tracemalloc.stop()


def varint(value: int) -> bytes:
    """Protobuf's base-128 varint of `value` (a negative one as 64-bit two's complement)."""
    value &= 2**64 - 1
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# --- mutations of valid inputs ---------------------------------------------------------

#: Byte strings that sit on parsing boundaries: varints and big-endian lengths near 2^31,
#: sign-flipped numbers, numbers past int64, line and field separators.
INTERESTING: tuple[bytes, ...] = (
    b"\xff\xff\xff\xff\x07",  # varint 2^31 - 1
    b"\x80\x80\x80\x80\x08",  # varint 2^31
    b"\xff\xff\xff\xff\x0f",  # varint 2^32 - 1 (negative as int32)
    b"\xff" * 10 + b"\x01",  # an 11-byte varint
    b"\x7f\xff\xff\xff",
    b"\x80\x00\x00\x00",
    b"\xff\xff\xff\xff",
    b"\x00\x50\x00\x00",
    b"-1",
    b"-102",
    b"0",
    b"2147483648",
    b"-9223372036854775809",
    b"9223372036854775808",
    b"9" * 40,
    b"0x7fffffffffffffff",
    b"\t",
    b"\n",
    b"\r\n",
    b"\r",
    b"{",
    b"}",
    b"<",
    b'"',
    b"\\",
    b"\\U0010ffff",
    b"\\400",
    b"\xc3\x28",  # not UTF-8
    b"\xed\xa0\x80",  # a UTF-8 encoded surrogate
    b"\x00",
    "²".encode(),  # a digit to str.isdigit, not to int()
)

_KINDS = ("flip", "set", "delete", "insert", "truncate", "duplicate", "interesting", "splice")
MUTATION = st.tuples(st.sampled_from(_KINDS), st.integers(0, 2**20), st.integers(0, 2**20))


def mutate(data: bytes, mutations: list[tuple[str, int, int]], donor: bytes = b"") -> bytes:
    """Applies `mutations` in order; each is (kind, where, how) with where/how taken modulo.

    "duplicate" repeats a slice in place, "interesting" writes one of
    `INTERESTING` over the bytes at `where`, "splice" copies a slice of `donor`
    (another valid input) in.
    """
    buf = bytearray(data)
    for kind, where, how in mutations:
        i = where % (len(buf) + 1)
        if kind == "flip" and buf:
            buf[i % len(buf)] ^= 1 << (how % 8)
        elif kind == "set" and buf:
            buf[i % len(buf)] = how % 256
        elif kind == "delete":
            del buf[i : i + 1 + how % 8]
        elif kind == "insert":
            buf[i:i] = bytes([how % 256])
        elif kind == "truncate":
            del buf[i:]
        elif kind == "duplicate":
            buf[i:i] = buf[i : i + 1 + how % 64]
        elif kind == "interesting":
            value = INTERESTING[how % len(INTERESTING)]
            buf[i : i + len(value)] = value
        elif kind == "splice" and donor:
            start = how % len(donor)
            buf[i:i] = donor[start : start + 1 + how % 32]
    return bytes(buf)


MUTATIONS = st.lists(MUTATION, min_size=1, max_size=6)
