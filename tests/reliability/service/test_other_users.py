"""Processes the project starts are its own: tried as the users of a shared login node are.

Each test runs the real ``unattended`` command as a throw-away local user (``other_users``;
skipped, saying so, when the suite is not root), with its own HOME, state directory,
Prefect server and runner:

- **A planted package.** User B plants ``flows/``, ``tasks/``, ``prefect/``,
  ``multiprocessing/``... in a world-writable folder (1777); each writes a marker when
  imported. User A runs ``up``, ``run``, ``serve`` (by hand) and ``serve --detach`` from
  there: no marker, the runner serves and the campaigns complete (the runner, its
  forkserver, its flow runs and the demo objective never look at the folder they were
  started from).
- **The second user of a login node.** Someone made ``$TMPDIR/runner_storage`` (0700)
  first; user A runs the README's first command (``unattended run
  examples/demo/campaign.toml``) with that TMPDIR: the campaign completes.
- **A runner that dies.** A runner that cannot take its lock (a ``runner.lock`` it may
  not open) makes ``serve --detach`` and ``up`` exit 1 with the log's last line, never
  "started"; a runner SIGKILLed while ``run`` follows a waiting run makes ``run`` exit 1
  saying so, never wait.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from other_users import LocalUser, local_users, shared_folder  # type: ignore[import-not-found]
from service_helpers import ROOT, demo_copy  # type: ignore[import-not-found]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900, func_only=True)]

# Top-level names a runner or what it starts imports: the project's packages, Prefect,
# and a standard-library one a fresh interpreter imports before any of ours.
PLANTED = ("flows", "tasks", "acceptance", "policies", "prefect", "cel", "multiprocessing")
PLANT = """\
import os, pathlib
folder = pathlib.Path(__file__).resolve().parent.parent
(folder / f"IMPORTED-{__name__}-uid{os.getuid()}").touch()
raise ImportError("planted by another user")
"""
# A cold server on a loaded 2-core machine took 90 s; a campaign of the demo ~1 min.
COMMAND_SECONDS = 600.0


@pytest.fixture(scope="module")
def users() -> Iterator[list[LocalUser]]:
    with local_users(2) as made:
        yield made


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _give(path: Path, user: LocalUser) -> None:
    """Make ``path`` (and what is under it) ``user``'s."""
    for item in [path, *path.rglob("*")]:
        os.chown(item, user.uid, user.gid, follow_symlinks=False)


class Session:
    """One user's state directory, server port and commands (run as that user)."""

    def __init__(self, user: LocalUser, label: str, **env: str) -> None:
        self.user = user
        self.home = user.home / f"state-{label}"
        self.env = user.env(
            UNATTENDED_HOME=str(self.home),
            UNATTENDED_SERVER_PORT=str(_free_port()),
            UNATTENDED_RUNNER_START_SECONDS="300",
            **env,
        )

    def run(self, *args: str, cwd: Path, timeout: float = COMMAND_SECONDS):
        return self.user.run(["unattended", *args], cwd=cwd, env=self.env, timeout=timeout)

    def runner_log(self) -> str:
        log = self.home / "runner.log"
        return log.read_text(errors="replace") if log.exists() else "(no runner log)"

    def runner_pid(self) -> int | None:
        """Return the pid of the runner that holds the lock, if it runs."""
        try:
            held = int((self.home / "runner.lock").read_text().strip())
        except (OSError, ValueError):
            return None
        return held if _alive(held) else None

    def serving_pid(self) -> int | None:
        """Return the runner's pid if it holds the lock and said it serves."""
        try:
            held = int((self.home / "runner.lock").read_text().strip())
            said = int((self.home / "runner.serving").read_text().strip())
        except (OSError, ValueError):
            return None
        return held if held == said and _alive(held) else None

    def stop(self) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.run("serve", "--stop", cwd=self.user.home, timeout=120)
            self.run("server", "stop", cwd=self.user.home, timeout=120)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def _spec(user: LocalUser, name: str, source: str = "campaign.toml", **settings: str) -> Path:
    """Copy the demo into ``user``'s home as campaign ``name``; return the spec."""
    spec = demo_copy(user.home / f"spec-{name}", source, name, **settings)
    _give(spec.parent, user)
    return spec


def _until(ready: Callable[[], bool], process: subprocess.Popen[bytes]) -> None:
    """Wait until ``ready()`` (at most ``COMMAND_SECONDS``) while ``process`` runs."""
    give_up = time.monotonic() + COMMAND_SECONDS
    while not ready():
        assert process.poll() is None, f"exited {process.returncode}"
        assert time.monotonic() < give_up, "not ready in time"
        time.sleep(0.1)


def _said(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"


class TestAPlantedPackage:
    def test_up_run_and_serve_from_a_shared_folder_never_import_it(
        self, users: list[LocalUser]
    ) -> None:
        owner, planter = users
        folder = shared_folder("planted-")
        try:
            for name in PLANTED:
                package = folder / name
                package.mkdir()
                (package / "__init__.py").write_text(PLANT)
                _give(package, planter)
            session = Session(owner, "planted")
            spec = _spec(owner, "planted-demo", rounds="2")
            try:
                up = session.run("up", cwd=folder)
                assert up.returncode == 0, _said(up) + session.runner_log()
                assert "runner started in the background" in up.stdout, _said(up)
                assert session.serving_pid() is not None, session.runner_log()

                ran = session.run("run", str(spec), cwd=folder)
                assert ran.returncode == 0, _said(ran) + session.runner_log()
                assert "finished: Completed" in ran.stdout, _said(ran)

                stopped = session.run("serve", "--stop", cwd=folder)
                assert stopped.returncode == 0, _said(stopped)
                # A runner started by hand in the folder: its forkserver and flow runs.
                foreground = owner.popen(
                    ["unattended", "serve"],
                    cwd=folder,
                    env=session.env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                try:
                    _until(lambda: session.serving_pid() == foreground.pid, foreground)
                    again = session.run("run", str(_spec(owner, "planted-by-hand")), cwd=folder)
                    assert again.returncode == 0, _said(again) + session.runner_log()
                finally:
                    foreground.terminate()
                    foreground.wait(timeout=60)
                detached = session.run("serve", "--detach", cwd=folder)
                assert detached.returncode == 0, _said(detached) + session.runner_log()
                assert "runner started in the background" in detached.stdout, _said(detached)
                assert session.serving_pid() is not None, session.runner_log()
            finally:
                session.stop()
            markers = sorted(p.name for p in folder.glob("IMPORTED-*"))
            assert markers == [], f"{owner.name}'s processes imported {markers}"
        finally:
            shutil.rmtree(folder, ignore_errors=True)


class TestTheSecondUserOfALoginNode:
    def test_the_readme_command_completes_after_another_user_made_runner_storage(
        self, users: list[LocalUser]
    ) -> None:
        owner, first = users
        tmpdir = shared_folder("shared-tmp-")
        try:
            made = first.run(
                ["mkdir", "-m", "700", str(tmpdir / "runner_storage")],
                cwd=first.home,
                env=first.env(),
                timeout=30,
            )
            assert made.returncode == 0, _said(made)
            assert (tmpdir / "runner_storage").stat().st_uid == first.uid
            session = Session(owner, "readme", TMPDIR=str(tmpdir))
            try:
                # The README's first command, from the checkout, as a user new to the node.
                ran = session.run("run", "examples/demo/campaign.toml", cwd=ROOT)
                assert ran.returncode == 0, _said(ran) + session.runner_log()
                assert "finished: Completed" in ran.stdout, _said(ran)
            finally:
                session.stop()
            storage = session.home / "runner" / "storage"
            assert storage.stat().st_uid == owner.uid
            assert storage.stat().st_mode & 0o777 == 0o700
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)


class TestARunnerThatDies:
    def test_serve_detach_and_up_exit_1_with_the_log_line_when_it_dies_at_start(
        self, users: list[LocalUser]
    ) -> None:
        owner = users[0]
        session = Session(owner, "dies-at-start")
        try:
            started = session.run("server", "start", cwd=owner.home)
            assert started.returncode == 0, _said(started)
            # A state file the runner must write, made by someone else and closed to it.
            lock = session.home / "runner.lock"
            lock.write_text("")
            os.chmod(lock, 0o600)
            for command in (["serve", "--detach"], ["up"]):
                done = session.run(*command, cwd=owner.home)
                assert done.returncode == 1, _said(done)
                assert "runner started" not in done.stdout, _said(done)
                assert "before it served" in done.stderr, _said(done)
                # The runner log's last line: what the runner died of.
                assert f"[Errno 13] Permission denied: '{lock}'" in done.stderr, _said(done)
        finally:
            (session.home / "runner.lock").unlink(missing_ok=True)
            session.stop()

    def test_run_exits_1_saying_so_when_its_runner_is_killed(self, users: list[LocalUser]) -> None:
        owner = users[0]
        session = Session(owner, "killed")
        spec = _spec(owner, "killed-demo", "campaign-approval.toml")
        following = owner.popen(
            ["unattended", "run", str(spec)],
            cwd=owner.home,
            env=session.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert following.stdout is not None
            seen = []
            for line in following.stdout:  # until the run waits for approval
                seen.append(line)
                if "Suspended" in line:
                    break
            else:
                pytest.fail(f"run ended before waiting: {''.join(seen)}{following.stderr.read()}")
            pid = session.runner_pid()
            assert pid is not None, session.runner_log()
            os.kill(pid, signal.SIGKILL)
            try:
                out, err = following.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                pytest.fail("run kept following a run whose runner was killed")
            assert following.returncode == 1, "".join(seen) + out + err
            assert f"the runner (pid {pid}) died" in err, err
            assert "was Suspended" in err, err
        finally:
            if following.poll() is None:
                following.kill()
                following.wait()
            session.stop()
