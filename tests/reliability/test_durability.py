"""A file-system cut under a live campaign keeps everything it had committed.

The campaign's state directory is an ext4 image of its own, loop-mounted with
``errors=remount-ro`` (as root; the test skips, naming why, where loop mounts are
not allowed). The demo campaign runs on it with the direct runner (the engine and
the real provenance store) until round 2's batch is on the allocation, held
there. Then, the campaign's process stopped for an instant so nothing commits in
between, the test reads what the store has committed, and cuts the file system
the way a power loss does: ``FS_IOC_SHUTDOWN`` with ``NOLOGFLUSH`` (what fstests'
``godown`` uses) ends all I/O at once, dropping what was written but never
synced. The image is then checked (``e2fsck -fy``) and mounted again.

The mount's ``commit=60`` keeps ext4 from syncing on its own within the test, as
any cut within the default 5 s commit interval would find it. Shown side by side
in the same cut: rows committed with ``synchronous = NORMAL`` to a second
database just before it are gone (the cut bites), every commit of the campaign's
store (``FULL``) is there, and the campaign continues without running round 0 or
1's batches again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import sqlite3
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PROJECT = Path(__file__).resolve().parents[2]
FS_IOC_SHUTDOWN = 0x8004587D  # _IOR('X', 125, __u32)
GOING_DOWN_NOLOGFLUSH = 2  # stop at once; do not flush the journal (a power cut)
TABLES = (
    "campaign",
    "round",
    "gate_call",
    "attempt",
    "policy_decision",
    "candidate_fate",
    "batch",
    "task_result",
    "campaign_event",
)
# The demo objective; the batch of round >= 2 waits while the hold file exists.
# ``{round}`` stays unfilled for the verifier, which never waits.
SIMULATION = """
import json, os, sys, time
from tasks.demo._objective import objective
round_, index, log, hold = sys.argv[1:5]
x = json.load(sys.stdin)
x = x["x"] if isinstance(x, dict) else x
verifier = round_ == "{round}"
if not verifier:
    while int(round_) >= 2 and os.path.exists(hold):
        time.sleep(0.05)
    with open(log, "a") as out:
        out.write(f"{round_} {index}\\n")
print(json.dumps({"value": objective([float(v) for v in x], "low" if verifier else "high")}))
"""


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)


@pytest.fixture
def ext4_disk(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """Mount a fresh 64 MiB ext4 image; yield (image, mount point); unmount at the end."""
    if os.geteuid() != 0:
        pytest.skip("DURABILITY TEST SKIPPED: loop-mounting an ext4 image needs root")
    for tool in ("mkfs.ext4", "e2fsck", "losetup", "mount", "umount"):
        if shutil.which(tool) is None:
            pytest.skip(f"DURABILITY TEST SKIPPED: {tool} is not installed (e2fsprogs, mount)")
    free = _run("losetup", "-f")
    if free.returncode != 0:
        pytest.skip(f"DURABILITY TEST SKIPPED: no free loop device: {free.stderr.strip()}")
    image, mount_point = tmp_path / "disk.img", tmp_path / "disk"
    with image.open("wb") as out:
        out.truncate(64 << 20)
    assert _run("mkfs.ext4", "-q", "-F", str(image)).returncode == 0
    mount_point.mkdir()
    mounted = _mount(image, mount_point)
    if mounted.returncode != 0:
        pytest.skip(f"DURABILITY TEST SKIPPED: cannot loop-mount here: {mounted.stderr.strip()}")
    try:
        yield image, mount_point
    finally:
        _run("umount", "-l", str(mount_point))


def _mount(image: Path, mount_point: Path) -> subprocess.CompletedProcess[str]:
    options = "loop,errors=remount-ro,commit=60"
    return _run("mount", "-o", options, str(image), str(mount_point))


def _cut(mount_point: Path) -> None:
    """End all I/O on the file system now, as a power loss would (nothing more is synced)."""
    descriptor = os.open(mount_point, os.O_RDONLY)
    try:
        fcntl.ioctl(descriptor, FS_IOC_SHUTDOWN, struct.pack("I", GOING_DOWN_NOLOGFLUSH))
    finally:
        os.close(descriptor)


def _committed(database: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Return every row of the provenance tables, as a reader sees the committed state."""
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as c:
        return {
            t: c.execute(f"SELECT * FROM {t} ORDER BY id").fetchall() for t in TABLES
        }  # table names are constants


def _count(database: Path, sql: str) -> int:
    try:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as c:
            return int(c.execute(sql).fetchone()[0])
    except sqlite3.OperationalError:
        return 0  # the file exists before its schema does


def _demo_copy(folder: Path, log: Path, hold: Path) -> Path:
    shutil.copytree(PROJECT / "examples" / "demo", folder)
    script = folder / "held_simulation.py"
    script.write_text(SIMULATION)
    argv = [sys.executable, str(script), "{round}", "{index}", str(log), str(hold)]
    spec = folder / "campaign.toml"
    text = spec.read_text()
    for old, new in {
        'name = "demo"': 'name = "durable"',
        'simulation = "demo"': f"simulation = {json.dumps(argv)}",
    }.items():
        assert old in text, old
        text = text.replace(old, new)
    spec.write_text(text)
    return spec


def _direct(spec: Path, home: Path, **popen: Any) -> subprocess.Popen[str]:
    """Start the direct runner in a session of its own (its simulations in its group)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNATTENDED_")}
    return subprocess.Popen(
        [sys.executable, "-m", "flows._cli._direct", str(spec), "--state-dir", str(home)],
        cwd=spec.parent,
        env=env,
        text=True,
        start_new_session=True,
        **popen,
    )


def test_a_file_system_cut_keeps_every_committed_row_and_the_campaign_goes_on(
    ext4_disk: tuple[Path, Path], tmp_path: Path
) -> None:
    image, disk = ext4_disk
    log, hold = tmp_path / "executions.txt", tmp_path / "hold"
    hold.touch()
    spec = _demo_copy(tmp_path / "demo", log, hold)
    home = disk / "home"
    database = home / "campaigns" / "durable" / "provenance.db"
    control = disk / "normal.db"
    with contextlib.closing(sqlite3.connect(control, isolation_level=None)) as c:
        c.execute("PRAGMA journal_mode = WAL")
        c.execute("CREATE TABLE t (n INTEGER)")
    os.sync()  # the control's schema is on disk: only its rows are at stake

    campaign = _direct(spec, home, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        held = "SELECT COUNT(*) FROM batch WHERE round_index = 2"
        while _count(database, held) == 0 or not log.exists():
            assert campaign.poll() is None, campaign.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "round 2's batch never launched"
            time.sleep(0.05)
        os.kill(campaign.pid, signal.SIGSTOP)  # nothing commits between the read and the cut
        before = _committed(database)
        with contextlib.closing(sqlite3.connect(control, isolation_level=None)) as c:
            c.execute("PRAGMA synchronous = NORMAL")
            for n in range(5):
                c.execute("INSERT INTO t VALUES (?)", (n,))  # five commits, never synced
            _cut(disk)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(campaign.pid, signal.SIGKILL)  # the runner and its held simulations
        campaign.communicate()

    assert _run("umount", str(disk)).returncode == 0
    checked = _run("e2fsck", "-fy", str(image))
    assert checked.returncode in (0, 1), checked.stdout + checked.stderr  # 1: errors fixed
    assert _mount(image, disk).returncode == 0

    with contextlib.closing(sqlite3.connect(control)) as c:
        assert c.execute("SELECT COUNT(*) FROM t").fetchone() == (0,)  # NORMAL lost them
    assert [len(before["round"]), len(before["batch"])] == [3, 3]  # rounds 0-1 done, 2 held
    after = _committed(database)
    assert after == before  # FULL kept every commit, and nothing else was half-written

    hold.unlink()
    finished = _direct(spec, home, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = finished.communicate(timeout=90)
    assert finished.returncode == 0, err[-2000:]
    assert json.loads(out.strip().splitlines()[-1])["status"] == "completed"
    executions = Counter(int(line.split()[0]) for line in log.read_text().splitlines())
    assert executions[0] == executions[1] == 8  # rounds 0 and 1 were not run again
    assert executions[3] == 8
