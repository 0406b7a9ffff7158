"""The worker, `recover --dry-run` and the Spark job must pick replacements by the same
rules, and upstream's choice may return a bookie that leaves the ensemble failing the very
placement rule it was chosen under.

Which bookies replace the bad positions of one segment: the worker's pure target choice.

The choice is a pure function of the metadata, the writable
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

**Placement repair** (`choose_adhering_moves`, with BookKeeper's
`repairedPlacementPolicyNotAdheringBookieEnabled`): no position is bad, the
segment as a whole fails the policy, and some of its copies move. Upstream's
rack-aware `replaceToAdherePlacementPolicy` (spec §3.4) builds a candidate
ensemble from each start index, keeping members where the rack rule allows, and
keeps the one that differs in the fewest positions; it refuses outright with
fewer than two racks, or fewer than `min(W, minNumRacksPerWriteQuorum)`, and
moves members that are not writable as well. Here the fewest moves are searched
for exactly: every set of 1, then 2, ... positions, each with every assignment
of candidate locations, judged with the placement core; the first size with an
adhering result wins, then the same order as above (strict before soft, the
window sum, upstream's rack order), uniformly among equals. A member that is
not writable stays where it is (its copies still serve reads; the worker moves
lost bookies' copies before it looks at placement). The search judges at most
`MOVE_SEARCH_LIMIT` ensembles; past that, copies move one at a time, each move
the one that most raises the windows' adherence, which may move more copies
than needed. The candidates are those of a repair (writable, valid id, never a
member). Every policy we judge is searched the same way: upstream supports
only the rack-aware one, and leaves other policies' ledgers marked forever.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass

from auditor.checks.placement import Adherence, PlacementPolicy, PolicyKind
from auditor.errors import AuditorError
from auditor.metadata.model import LedgerMetadata
from auditor.metadata.serde import is_valid_bookie_id
from auditor.topology.locations import DEFAULT_RACK

#: Most joint location assignments tried at once (locations ** bad positions).
SEARCH_LIMIT = 4096
#: Most trial ensembles judged in the exact search for the fewest placement moves.
MOVE_SEARCH_LIMIT = 5_000
#: Locations a refusal names before it says how many more there are.
_NAMED = 8


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


class CannotAdhereError(AuditorError):
    """No moves of one segment's copies make it adhere to the placement policy.

    The message names the segment, why it fails, and what was available, and is the
    same from one attempt to the next while nothing changes (the worker reports a
    refusal once, by its text).
    """

    def __init__(self, ledger_id: int, segment_index: int, first_entry: int, reason: str) -> None:
        self.ledger_id = ledger_id
        self.segment_index = segment_index
        self.first_entry = first_entry
        self.reason = reason
        super().__init__(
            f"ledger {ledger_id} segment {segment_index} (from entry {first_entry}) "
            f"cannot be made to adhere to the placement policy: {reason}"
        )


#: How good a choice is, higher better: (adherence, window adherence sum, -upstream order).
_Score = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class _Candidates:
    """The bookies that may receive a copy of one segment, and how many were passed over."""

    #: Writable, valid bookie ids, outside the ensemble (sorted: a seeded rng gives one answer).
    pool: list[str]
    #: Registered under names no bookie id can be: never targets.
    invalid: int
    #: In the default rack, refused with `enforceMinNumRacksPerWriteQuorum`.
    excluded_default: int
    enforce: bool

    @classmethod
    def of(
        cls,
        ensemble: Sequence[str],
        writable: Set[str],
        policy: PlacementPolicy,
        loc: Callable[[str], str],
    ) -> _Candidates:
        members = set(ensemble)
        # A registration is untrusted input: one whose name no bookie id can be (created
        # under an open `available/` by anyone) is never a copy target.
        invalid = sum(1 for b in writable if not is_valid_bookie_id(b))
        pool = sorted(b for b in writable if b not in members and is_valid_bookie_id(b))
        enforce = policy.kind is PolicyKind.RACKAWARE and policy.enforce_min_racks_per_write_quorum
        excluded_default = 0
        if enforce:
            kept = [b for b in pool if loc(b) != DEFAULT_RACK]
            excluded_default = len(pool) - len(kept)
            pool = kept
        return cls(pool, invalid, excluded_default, enforce)

    def passed_over(self) -> str:
        """What the count of candidates leaves out, for a refusal's reason ("" if nothing)."""
        out = ""
        if self.invalid:
            out += f" ({self.invalid} more registered under names no bookie id can be)"
        if self.excluded_default:
            out += (
                f" ({self.excluded_default} more in {DEFAULT_RACK}, refused with "
                "enforceMinNumRacksPerWriteQuorum)"
            )
        return out


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

    candidates = _Candidates.of(ensemble, writable, policy, loc)
    pool, enforce = candidates.pool, candidates.enforce
    if len(pool) < len(positions):
        raise fail(
            f"{len(pool)} writable bookie(s) outside the ensemble for {len(positions)} "
            f"position(s){candidates.passed_over()}"
        )
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
    scored = list(_scored(ensemble, positions, left, policy, locations, write_quorum, enforce))
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


def choose_adhering_moves(
    md: LedgerMetadata,
    segment_index: int,
    *,
    writable: Set[str],
    policy: PlacementPolicy,
    locations: Mapping[str, str],
    rng: random.Random,
) -> dict[int, str]:
    """The fewest positions of segment `segment_index` to move, and their new bookies,
    so that the segment adheres to `policy` ({} when it adheres already).

    Raises CannotAdhereError when no moves to the candidates make it adhere: too few
    racks (an E3/W2 segment needs three: its three windows of two wrap around, so two
    racks always leave one window in a single rack), too few writable bookies outside
    the ensemble, or a rule no location changes (zone-aware's E a multiple of W).
    """
    if not 0 <= segment_index < len(md.segments):
        raise ValueError(f"segment index {segment_index} outside 0..{len(md.segments) - 1}")
    segment = md.segments[segment_index]
    ensemble = list(segment.bookies)
    wq = md.write_quorum
    verdict = policy.check(ensemble, wq, locations)
    if verdict.adherence is not Adherence.FAIL:
        return {}

    def fail(reason: str) -> CannotAdhereError:
        return CannotAdhereError(md.ledger_id, segment_index, segment.first_entry_id, reason)

    if verdict.window_start is None:
        raise fail(f"{verdict.reason}; no choice of bookies changes that")
    default = policy.default_location

    def loc(bookie: str) -> str:
        return locations.get(bookie) or default

    candidates = _Candidates.of(ensemble, writable, policy, loc)
    left: dict[str, list[str]] = {}
    for bookie in candidates.pool:
        left.setdefault(loc(bookie), []).append(bookie)
    names = sorted(left)
    spent = 0
    for k in range(1, min(len(ensemble), len(candidates.pool)) + 1):
        subsets = list(itertools.combinations(range(len(ensemble)), k))
        cost = len(subsets) * len(names) ** k
        if spent + cost > MOVE_SEARCH_LIMIT:
            greedy = _greedy_moves(ensemble, left, policy, locations, wq, rng)
            if greedy is not None:
                return greedy
            break
        spent += cost
        found = [
            (score, positions, combo, weight)
            for positions in subsets
            for score, combo, weight in _scored(
                ensemble, positions, left, policy, locations, wq, False, adhering_only=True
            )
        ]
        if found:
            top = max(score for score, _, _, _ in found)
            best = [(p, c, w) for score, p, c, w in found if score == top]
            positions, combo, _ = rng.choices(best, weights=[w for _, _, w in best])[0]
            moves: dict[int, str] = {}
            for p, x in zip(positions, combo, strict=True):
                moves[p] = left[x].pop(rng.randrange(len(left[x])))
            return moves
    shown = ", ".join(names[:_NAMED]) + (
        f" and {len(names) - _NAMED} more" if len(names) > _NAMED else ""
    )
    where = f" in {shown}" if names else ""
    raise fail(
        f"{verdict.reason}, and no move to the {len(candidates.pool)} writable bookie(s) "
        f"outside the ensemble{where}{candidates.passed_over()} makes every write quorum "
        "adhere"
    )


def _scored(
    ensemble: Sequence[str],
    positions: Sequence[int],
    left: Mapping[str, list[str]],
    policy: PlacementPolicy,
    locations: Mapping[str, str],
    write_quorum: int,
    enforce: bool,
    *,
    adhering_only: bool = False,
) -> Iterator[tuple[_Score, tuple[str, ...], int]]:
    """Every allowed assignment of candidate locations to `positions`, with its score and
    its weight (the number of ways candidate bookies realise it).

    With `enforce`, a failing assignment that puts a position "anywhere" (upstream's
    third choice) is not allowed; with `adhering_only`, no failing one is.
    """
    default = policy.default_location

    def loc(bookie: str) -> str:
        return locations.get(bookie) or default

    old = [loc(ensemble[p]) for p in positions]
    names = sorted(x for x, bookies in left.items() if bookies)
    trial = list(ensemble)
    for combo in itertools.product(names, repeat=len(positions)):
        uses = Counter(combo)
        if any(n > len(left[x]) for x, n in uses.items()):
            continue
        taken: Counter[str] = Counter()
        for p, x in zip(positions, combo, strict=True):
            trial[p] = left[x][taken[x]]
            taken[x] += 1
        adherence = policy.check(trial, write_quorum, locations).adherence
        if adhering_only and adherence is Adherence.FAIL:
            continue
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
        yield score, combo, weight


def _greedy_moves(
    ensemble: Sequence[str],
    left: Mapping[str, list[str]],
    policy: PlacementPolicy,
    locations: Mapping[str, str],
    write_quorum: int,
    rng: random.Random,
) -> dict[int, str] | None:
    """Past the exact search: one move at a time, each the one that most raises the
    windows' adherence sum, until the segment adheres; None when no move raises it.

    Only a position in a failing window can help, and a move changes only the W windows
    holding that position, so each option is judged on those windows alone.
    """
    size = len(ensemble)
    trial = list(ensemble)
    spare = {x: list(bookies) for x, bookies in left.items()}

    def window(start: int) -> int:
        members = [trial[(start + j) % size] for j in range(write_quorum)]
        return int(policy.check(members, write_quorum, locations).adherence)

    def holding(p: int) -> list[int]:
        return [(p - j) % size for j in range(write_quorum)]

    scores = [window(start) for start in range(size)]
    moves: dict[int, str] = {}
    while int(Adherence.FAIL) in scores:
        failing = {start for start, v in enumerate(scores) if v == int(Adherence.FAIL)}
        options: list[tuple[int, int, str]] = []
        for p in range(size):
            if p in moves or not failing & set(holding(p)):
                continue
            for x in sorted(x for x, bookies in spare.items() if bookies):
                trial[p] = spare[x][0]
                gain = sum(window(s) - scores[s] for s in holding(p))
                if gain > 0:
                    options.append((gain, p, x))
            trial[p] = ensemble[p]
        if not options:
            return None
        top = max(gain for gain, _, _ in options)
        _, p, x = rng.choice([o for o in options if o[0] == top])
        trial[p] = moves[p] = spare[x].pop(rng.randrange(len(spare[x])))
        for start in holding(p):
            scores[start] = window(start)
    if policy.check(trial, write_quorum, locations).adherence is Adherence.FAIL:
        return None
    return moves
