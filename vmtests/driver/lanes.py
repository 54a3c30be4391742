"""Jobs that each drive guests of their own, run side by side: ``vmtests selftest``'s lanes.

Each lane is a thread; the guests' TCG thread mode is chosen for the guests at once
(``qemu_launch.guests_at_once``). On a failure or Ctrl-C every child process is killed and no
new one starts (``procs.stop_children``) until every lane has ended, so the other lanes fail at
once instead of starting their next guest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import TypeVar

from vmtests.driver import procs, qemu_launch

Result = TypeVar("Result")


def run_in_lanes(jobs: Sequence[Callable[[], Result]], lanes: int) -> list[Result]:
    """Run ``jobs`` (each drives guests of its own) ``lanes`` at a time; their results in order.

    On an error or Ctrl-C every child process is killed and no new one starts
    (``procs.stop_children``) until every lane has ended, so that the other lanes' guests fail
    at once rather than run on; then the first error is raised.
    """
    if lanes <= 1:
        return [job() for job in jobs]
    with (
        qemu_launch.guests_at_once(lanes),
        ThreadPoolExecutor(lanes, thread_name_prefix="lane") as pool,
    ):
        futures = [pool.submit(job) for job in jobs]
        try:
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            for future in futures:
                if future in done and future.exception() is not None:
                    future.result()  # raises that lane's error before waiting for the others
            return [future.result() for future in futures]
        except BaseException:
            for future in futures:
                future.cancel()
            # Every lane's guest dies, so every lane fails at once; none starts another.
            procs.stop_children()
            pool.shutdown(wait=True)
            procs.allow_children()  # not reached on a second Ctrl-C: the process is ending
            raise
