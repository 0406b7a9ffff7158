"""How `make test` shares the suite among its pytest-xdist workers (`-n 2 --dist loadgroup`).

Every test is a unit of work of its own, handed to whichever worker is free, except the
interop suite: tests/interop is one unit, so one worker runs all of it, in file order. Its
tests start JVMs (real bookies, Java AutoRecovery, a Pulsar broker) and share what is
costly to make: the Java programs compiled once per session, clusters a whole module
shares. Spread over the workers, each would compile and start them again, and their JVMs
would start beside each other's on the two cores.

Units go out largest first (xdist's `--loadscope-reorder`, on by default): the interop
unit, minutes long, starts at once, and the other workers share everything else beside it
instead of one worker running it alone at the end.

xdist's own `loadgroup` reads `xdist_group` marks through the test ids, which it appends
the group to; pytest 9.2's test ids can no longer be changed that way, so the marks are
silently ignored there (pytest-dev/pytest-xdist#1386). This scheduler needs no mark: it
goes by the test's path, and still honours a group suffix where xdist manages to add one.
"""

from __future__ import annotations

from xdist.scheduler import LoadGroupScheduling

#: Test ids are relative to the repository's root (the rootdir: pyproject.toml).
INTEROP = "tests/interop/"
#: The standalone Spark cluster's tests share one cluster (a master and two workers, JVMs)
#: and the packed virtualenv, both made once per session: one unit, so one worker makes
#: them. With more tests than any other unit but the interop suite, it goes out second.
SPARK_STANDALONE = "tests/integration/test_spark_standalone.py"


class InteropOnOneWorker(LoadGroupScheduling):  # type: ignore[misc]  # xdist is untyped
    def _split_scope(self, nodeid: str) -> str:
        if nodeid.startswith(INTEROP):
            return INTEROP
        if nodeid.startswith(SPARK_STANDALONE):
            return SPARK_STANDALONE
        return str(super()._split_scope(nodeid))
