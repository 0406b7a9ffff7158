"""Which bookies replace the bad positions of one segment: the worker's pure target choice.

The worker, `recover --dry-run` and the Spark job must pick replacements by the
same rules, so the choice is a pure function of the metadata, the writable
bookies, the placement policy with bookie locations, and a random source.

Candidates are writable bookies outside the segment's ensemble (spec §3.2:
never read-only, never lost, never a member, never one target for two
positions), registered under a valid bookie id (the rule the checks apply).
With the rack-aware policy and `enforceMinNumRacksPerWriteQuorum`, bookies of
the default rack are no candidates either (upstream's step 1).

Upstream's rack-aware `replaceBookie` (spec §3.3) takes the first bookie it
finds in the order *same rack as the replaced bookie*, *a rack no other member
uses*, *anywhere*, and returns it even when the new ensemble fails the
placement rule. Here every assignment of candidate locations to the bad
positions is judged with the placement core (`checks/placement.py`) on the
resulting ensemble, and the best wins:

1. the segment's adherence (strict, then soft, then fail), so the segment
   adheres afterwards whenever some choice allows it;
2. then the sum of the adherence of its write-quorum windows, so a segment
   that cannot adhere at least does not gain failing windows;
3. then upstream's order, per position: its old location (0), a location no
   other member of the new ensemble has (1), anywhere (2); summed.

Among equals the choice is uniform over the candidate bookies (the rng). With
`enforceMinNumRacksPerWriteQuorum`, "anywhere" is refused unless the segment
then adheres (upstream refuses it always; an adhering choice is strictly
better than none). Without it, a failing choice is still taken when nothing
adheres: a copy in the wrong rack beats a missing copy.

Adherence depends on locations only, so the search runs over locations with
the candidates counted per location; up to `SEARCH_LIMIT` joint assignments
are tried at once, beyond that the positions are chosen one after another.

The default policy has no topology: a uniformly random writable non-member.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence, Set

from auditor.checks.placement import Adherence, PlacementPolicy, PolicyKind
from auditor.errors import AuditorError
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.serde import is_valid_bookie_id
from auditor.topology.locations import DEFAULT_RACK

#: Most joint location assignments tried at once (locations ** bad positions).
SEARCH_LIMIT = 4096


class NoTargetError(AuditorError):
    """No allowed replacement for the bad positions of one segment; the message says why."""

    def __init__(
        self,
        ledger_id: int,
        segment_index: int,
        first_entry: int,
        positions: Sequence[int],
        reason: str,
    ) -> None:
        self.ledger_id = ledger_id
        self.segment_index = segment_index
        self.first_entry = first_entry
        self.positions = tuple(positions)
        self.reason = reason
        where = ", ".join(str(p) for p in positions)
        super().__init__(
            f"ledger {ledger_id} segment {segment_index} (from entry {first_entry}): "
            f"no replacement for position(s) {where}: {reason}"
        )


#: How good a choice is, higher better: (adherence, window adherence sum, -upstream order).
_Score = tuple[int, int, int]


def choose_targets(
    md: LedgerMetadata,
    segment_index: int,
    bad_indexes: Sequence[int],
    *,
    writable: Set[str],
    policy: PlacementPolicy,
    locations: Mapping[str, str],
    rng: random.Random,
) -> dict[int, str]:
    """A distinct new bookie for each bad position of segment `segment_index`.

    `locations` maps bookie ids to network locations (a bookie it lacks gets the
    policy's default location, as in the placement check). Raises NoTargetError
    when no allowed choice exists; ValueError for indexes outside the metadata.
    """
    if not 0 <= segment_index < len(md.segments):
        raise ValueError(f"segment index {segment_index} outside 0..{len(md.segments) - 1}")
    segment = md.segments[segment_index]
    ensemble = list(segment.bookies)
    positions = list(bad_indexes)
    if len(set(positions)) != len(positions) or any(not 0 <= p < len(ensemble) for p in positions):
        raise ValueError(f"bad positions {positions} are not distinct indexes of the ensemble")
    if not positions:
        return {}

    def fail(reason: str) -> NoTargetError:
        return NoTargetError(md.ledger_id, segment_index, segment.first_entry_id, positions, reason)

    default = policy.default_location

    def loc(bookie: str) -> str:
        return locations.get(bookie) or default

    members = set(ensemble)
    # A registration is untrusted input: one whose name no bookie id can be (created under
    # an open `available/` by anyone) is never a copy target.
    invalid = sorted(b for b in writable if not is_valid_bookie_id(b))
    pool = sorted(b for b in writable if b not in members and is_valid_bookie_id(b))
    enforce = policy.kind is PolicyKind.RACKAWARE and policy.enforce_min_racks_per_write_quorum
    excluded_default = 0
    if enforce:
        kept = [b for b in pool if loc(b) != DEFAULT_RACK]
        excluded_default = len(pool) - len(kept)
        pool = kept
    if len(pool) < len(positions):
        reason = (
            f"{len(pool)} writable bookie(s) outside the ensemble for {len(positions)} position(s)"
        )
        if invalid:
            reason += f" ({len(invalid)} more registered under names no bookie id can be)"
        if excluded_default:
            reason += (
                f" ({excluded_default} more in {DEFAULT_RACK}, refused with "
                "enforceMinNumRacksPerWriteQuorum)"
            )
        raise fail(reason)
    if policy.kind is PolicyKind.DEFAULT:
        return dict(zip(positions, rng.sample(pool, len(positions)), strict=True))

    #: The candidates still free, by location (sorted, so a seeded rng gives one answer).
    left: dict[str, list[str]] = {}
    for bookie in pool:
        left.setdefault(loc(bookie), []).append(bookie)
    chosen: dict[int, str] = {}
    # Jointly while the search is small; else one position after another.
    joint = len(left) ** len(positions) <= SEARCH_LIMIT
    steps = [positions] if joint else [[p] for p in positions]
    for step in steps:
        combo = _best(ensemble, step, left, policy, locations, md.write_quorum, enforce, rng)
        if combo is None:
            raise fail(
                "with enforceMinNumRacksPerWriteQuorum, every candidate leaves the segment "
                "failing placement from a rack that is neither the replaced bookie's nor "
                "one no other member uses"
            )
        for p, x in zip(step, combo, strict=True):
            bookie = left[x].pop(rng.randrange(len(left[x])))
            ensemble[p] = bookie
            chosen[p] = bookie
    return chosen


def _best(
    ensemble: Sequence[str],
    positions: Sequence[int],
    left: Mapping[str, list[str]],
    policy: PlacementPolicy,
    locations: Mapping[str, str],
    write_quorum: int,
    enforce: bool,
    rng: random.Random,
) -> tuple[str, ...] | None:
    """The best location for each position, or None when no choice is allowed.

    Among equally good choices, one is drawn with a weight equal to the number of
    ways candidate bookies realise it, so that together with the uniform draw of
    the bookies the result is uniform over equally good bookie assignments.
    """
    default = policy.default_location

    def loc(bookie: str) -> str:
        return locations.get(bookie) or default

    old = [loc(ensemble[p]) for p in positions]
    names = sorted(x for x, bookies in left.items() if bookies)
    trial = list(ensemble)
    scored: list[tuple[_Score, tuple[str, ...], int]] = []
    for combo in itertools.product(names, repeat=len(positions)):
        uses = Counter(combo)
        if any(n > len(left[x]) for x, n in uses.items()):
            continue
        taken: Counter[str] = Counter()
        for p, x in zip(positions, combo, strict=True):
            trial[p] = left[x][taken[x]]
            taken[x] += 1
        adherence = policy.check(trial, write_quorum, locations).adherence
        order = 0
        worst = 0
        for t, (p, x) in enumerate(zip(positions, combo, strict=True)):
            if x == old[t]:
                tier = 0
            elif all(loc(b) != x for q, b in enumerate(trial) if q != p):
                tier = 1
            else:
                tier = 2
            order += tier
            worst = max(worst, tier)
        if enforce and adherence is Adherence.FAIL and worst == 2:
            continue
        weight = math.prod(math.perm(len(left[x]), n) for x, n in uses.items())
        score = (int(adherence), _window_sum(trial, write_quorum, policy, locations), -order)
        scored.append((score, combo, weight))
    if not scored:
        return None
    top = max(score for score, _, _ in scored)
    best = [(combo, weight) for score, combo, weight in scored if score == top]
    return rng.choices([c for c, _ in best], weights=[w for _, w in best])[0]


def _window_sum(
    ensemble: Sequence[str],
    write_quorum: int,
    policy: PlacementPolicy,
    locations: Mapping[str, str],
) -> int:
    """The adherence of each write-quorum window on its own, summed over the E windows."""
    size = len(ensemble)
    total = 0
    for start in range(size):
        window = [ensemble[(start + j) % size] for j in range(write_quorum)]
        total += int(policy.check(window, write_quorum, locations).adherence)
    return total
