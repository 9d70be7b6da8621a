"""Children are watched through pidfds on their own loop, not by a thread each.

Each check runs in a child interpreter: the watcher is installed for a whole process,
and the property is about a process where it was installed by ``run_executable``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="pidfds are Linux's; elsewhere asyncio's default stays"
)

PROGRAM = textwrap.dedent(
    """
    import asyncio, json, sys, threading, time
    from tasks._executables import run_executable
    from tasks._results import ExecutableTask

    stop = threading.Event()

    def busy():  # Prefect's threads in a flow-run process, in miniature
        while not stop.is_set():
            sum(range(1000))

    for _ in range(4):
        threading.Thread(target=busy, daemon=True).start()
    waiters = set()

    def spy():
        while not stop.is_set():
            waiters.update(t.name for t in threading.enumerate() if t.name.startswith("waitpid"))
            time.sleep(0.001)

    threading.Thread(target=spy, daemon=True).start()

    def task(code, sleep=0.0, stdin=None):
        script = f"import sys, time; time.sleep({sleep}); print(sys.stdin.read().strip()); "
        script += f"sys.exit({code})"
        return ExecutableTask(argv=[sys.executable, "-c", script], stdin=stdin)

    async def batch(first):
        tasks = [task((first + i) % 4, 0.01 * (i % 3), stdin=f"in{i}".encode()) for i in range(12)]
        outcomes = await asyncio.gather(
            *(run_executable(t, time_limit=30, grace=1) for t in tasks)
        )
        return [[o.exit_code, o.stdout.strip()] for o in outcomes]

    async def timed_out():
        slow = ExecutableTask(argv=[sys.executable, "-c", "import time; time.sleep(60)"])
        outcome = await run_executable(slow, time_limit=0.5, grace=0.5)
        return [outcome.timed_out, outcome.exit_code]

    main = asyncio.run(batch(0))
    # Two loops in two threads at once: each child reports to the loop that spawned it.
    results = {}

    def other(name, first):
        results[name] = asyncio.run(batch(first))

    threads = [threading.Thread(target=other, args=(f"t{n}", n)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    killed = asyncio.run(timed_out())
    stop.set()
    watcher = type(asyncio.get_child_watcher()).__name__ if sys.version_info < (3, 12) else None
    print(json.dumps({
        "main": main, "threads": results, "killed": killed,
        "waiters": sorted(waiters), "watcher": watcher,
    }))
    """
)


def expected(first: int) -> list[list[object]]:
    return [[(first + i) % 4, f"in{i}"] for i in range(12)]


def test_children_exit_codes_and_output_arrive_without_a_thread_per_child() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["main"] == expected(0)
    assert found["threads"] == {"t1": expected(1), "t2": expected(2)}
    timed_out, exit_code = found["killed"]
    assert timed_out is True
    assert exit_code is not None
    assert exit_code < 0
    if sys.version_info < (3, 12):
        assert found["watcher"] == "RunningLoopPidfdWatcher"
    # asyncio's ThreadedChildWatcher names its threads waitpid-N: none was ever started.
    assert found["waiters"] == []


def test_a_child_reaped_elsewhere_reports_255_and_frees_its_pidfd() -> None:
    program = textwrap.dedent(
        """
        import asyncio, json, os, sys
        from tasks._child_watcher import RunningLoopPidfdWatcher

        async def main():
            watcher = RunningLoopPidfdWatcher()
            got = asyncio.get_running_loop().create_future()
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            watcher.add_child_handler(pid, lambda p, code: got.set_result(code))
            os.waitpid(pid, 0)  # someone else reaps it first
            code = await asyncio.wait_for(got, 30)
            removed = watcher.remove_child_handler(pid)  # already gone: nothing to remove
            return code, removed, len(watcher._children)

        print(json.dumps(asyncio.run(main())))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [255, False, 0]
