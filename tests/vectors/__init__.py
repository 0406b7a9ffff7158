"""Golden vectors copied from ../shared/vectors, so the suite reads nothing outside the repo."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def load(name: str) -> Any:
    return json.loads((Path(__file__).parent / name).read_text())
