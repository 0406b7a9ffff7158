"""The atheris corpus seeds are valid inputs that pass their targets."""

from __future__ import annotations

import pytest

from tests.fuzz.support import run
from tests.fuzz.targets import TARGETS, seeds

pytestmark = pytest.mark.fuzz


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_seeds_pass_their_targets(name: str) -> None:
    assert seeds(name)
    for data in seeds(name):
        run(TARGETS[name], data)
