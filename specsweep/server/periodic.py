"""A reading taken again and again in the background while a level runs (``async with``).

The engine's ``/metrics`` sampler and the GPU watch are both one: a subclass writes ``_loop``,
which reads until it gives up or is cancelled when the level ends. A reading that fails is the
subclass's to count; the loop never fails the level.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType
from typing import Self


class Periodic:
    _task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
