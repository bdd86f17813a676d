"""``ingest.Commits``: an ingest request's wait for its batch's commit, settled from the
writer thread, timed out by one timer for all the waits, and never cancelling the write."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

import pytest
from fleetlens.api.ingest import Commits, Slots


def _later(fut: Future, value: object, after_s: float) -> None:
    def settle() -> None:
        if isinstance(value, BaseException):
            fut.set_exception(value)
        else:
            fut.set_result(value)

    threading.Timer(after_s, settle).start()  # as the writer thread does


def test_outcomes_timeouts_and_hang_ups() -> None:
    async def main() -> None:
        commits = Commits(0.3)
        ok, failed, slow, never, dropped = (Future() for _ in range(5))
        _later(ok, True, 0.05)
        _later(failed, OSError("disk full"), 0.05)
        _later(slow, True, 0.6)  # past its deadline: the commit still happens
        waits = [commits.wait(f) for f in (ok, failed, slow, never)]
        hung_up = asyncio.ensure_future(commits.wait(dropped))
        await asyncio.sleep(0.1)
        hung_up.cancel()  # the client went away
        got = await asyncio.gather(*waits, return_exceptions=True)
        assert got[0] is True
        assert isinstance(got[1], OSError) and str(got[1]) == "disk full"
        assert isinstance(got[2], TimeoutError) and isinstance(got[3], TimeoutError)
        assert not dropped.cancelled()  # its write goes on
        dropped.set_result(True)
        await asyncio.sleep(0.7)
        assert slow.result() is True
        # later waits are timed again, after the timer had nothing left
        late = Future()
        _later(late, False, 0.05)
        assert await commits.wait(late) is False
        with pytest.raises(TimeoutError):
            await commits.wait(Future())
        assert not commits._waits and commits._timer is None

    asyncio.run(main())


def test_what_waits_stays_as_many_as_in_flight() -> None:
    async def main() -> None:
        commits = Commits(60)
        for _ in range(1000):
            f = Future()
            f.set_result(True)
            assert await commits.wait(f) is True
        assert len(commits._waits) <= 1

    asyncio.run(main())


def test_slots_bound_order_and_cancellation() -> None:
    """``ingest.Slots``: never more holders than slots, first come first served, and a waiter
    cancelled before or after its turn leaves no slot behind."""

    async def main() -> None:
        slots, inside, order = Slots(2), [0], []

        async def job(i: int, hold_s: float) -> None:
            async with slots:
                inside[0] += 1
                assert inside[0] <= 2
                order.append(i)
                await asyncio.sleep(hold_s)
                inside[0] -= 1

        tasks = [asyncio.ensure_future(job(i, 0.02)) for i in range(8)]
        await asyncio.sleep(0)
        tasks[5].cancel()  # waiting: skipped
        await asyncio.gather(*tasks, return_exceptions=True)
        assert order == [0, 1, 2, 3, 4, 6, 7]
        # handed a slot and cancelled before it ran: the slot goes on
        a, b = asyncio.ensure_future(job(10, 0.05)), asyncio.ensure_future(job(11, 0.05))
        await asyncio.sleep(0.01)
        c = asyncio.ensure_future(job(12, 0))
        await asyncio.sleep(0)
        slots._release()  # as if a holder left: c's slot is set...
        c.cancel()  # ...and c is cancelled before it resumes
        await asyncio.gather(a, b, c, return_exceptions=True)
        assert slots._free == 3 and not slots._waiters  # 2 + the extra release above

    asyncio.run(main())
