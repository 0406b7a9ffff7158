"""The engines import their interface from `auditor.scan.engine` (with the helpers they
share), so what names every engine's class cannot live there without an import cycle.

Opening an engine by name: the one module that knows every engine's class.
"""

from __future__ import annotations

from pathlib import Path

from auditor.scan.engine import Engine, EngineOptions, EngineUnavailableError, need_pyarrow
from auditor.scan.options import ENGINES


async def start_engine(options: EngineOptions, out: Path | None) -> Engine:
    """`open_engine` off the event loop: a Spark session takes seconds to start."""
    import asyncio

    return await asyncio.to_thread(open_engine, options, out)


def open_engine(options: EngineOptions, out: Path | None) -> Engine:
    """The engine, or one line saying what to install (blocks while Spark starts)."""
    if options.name == "asyncio":
        from auditor.scan.local import LocalEngine

        if out is not None:
            need_pyarrow("asyncio")
        return LocalEngine(out)
    if options.name == "spark":
        from auditor.scan.spark import SparkEngine

        return SparkEngine(options, out)
    raise EngineUnavailableError(
        f"unknown engine {options.name!r}; expected one of {', '.join(ENGINES)}"
    )
