"""A private single-node Slurm for the session, and sites that use it.

``slurm_cluster`` installs ``slurm-wlm`` and ``munge`` with apt-get when they are
missing (as root, like the browser tests install Chromium), starts munged,
slurmctld and slurmd under a temporary folder on free ports bound to 127.0.0.1,
runs a probe job, and points this process at it (``SLURM_CONF``). At the end every
job is cancelled and the daemons are stopped by their pid files. It skips, naming
the reason, only where Slurm cannot be installed or run (not root, no apt).

Walltime tests cost ~90 s each (Slurm checks limits every 30 s): one runs by
default, larger ones are marked ``long``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # importlib mode: make private_slurm importable

from private_slurm import (  # type: ignore[import-not-found]  # after the path
    SlurmCluster,
    SlurmStartFailed,
    ensure_slurm_installed,
    start_cluster,
)

#: AF_UNIX paths (the munge socket) must stay under 108 bytes.
_MAX_ROOT = 60


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """Start one private Slurm for the session; cancel its jobs and stop it at the end."""
    failure = ensure_slurm_installed()
    if failure is not None:
        pytest.skip(
            f"SLURM TESTS SKIPPED: {failure}; as root run "
            "`apt-get update && apt-get install -y slurm-wlm munge`"
        )
    root = tmp_path_factory.mktemp("slurm")
    scratch = None
    if len(str(root)) > _MAX_ROOT:
        scratch = root = Path(tempfile.mkdtemp(prefix="unattended-slurm-"))
    try:
        cluster = start_cluster(root)
    except SlurmStartFailed as exc:
        pytest.fail(f"the private Slurm did not start: {exc}")
    saved = {key: os.environ.get(key) for key in os.environ if key.startswith("SLURM_")}
    for key in saved:
        del os.environ[key]
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        cluster.stop()
        os.environ.pop("SLURM_CONF", None)
        for key, value in saved.items():
            if value is not None:
                os.environ[key] = value
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmCluster]:
    """The session's cluster, idle before the test; the test's jobs are cancelled after it.

    The root conftest strips ``SLURM_*`` around every test: ``SLURM_CONF`` is set
    again here, for this test only.
    """
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    slurm_cluster.cancel_all()
    slurm_cluster.wait_idle()
    yield slurm_cluster
    slurm_cluster.cancel_all()


@pytest.fixture(scope="session")
def radical_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a Python with RADICAL-Pilot: an overlay venv on top of this one.

    RADICAL-Pilot stays out of the test extra (it pins packaging<=25 and psutil<=7.0,
    and rhapsody then imports it for every backend). The overlay venv installs
    ``rhapsody-py[radical-pilot]`` into its own site-packages, which comes first,
    and reads everything else (unattended itself, prefect, dask) from this venv.

    Made once per session (~40 s with pip's wheel cache warm; RADICAL-Pilot's
    packages are sdists, built on the first install). It skips only where a venv
    cannot be made at all (no ``ensurepip``); a failed ``pip install`` fails the
    tests: the package registries that installed the test extra serve it too.
    """
    import subprocess
    import sysconfig

    folder = tmp_path_factory.mktemp("radical-venv")
    done = subprocess.run([sys.executable, "-m", "venv", str(folder)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"RADICAL-PILOT TESTS SKIPPED: python -m venv failed: {done.stderr[-300:]!r}")
    python = folder / "bin" / "python"
    overlay = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    base = sysconfig.get_paths()["purelib"]
    # addsitedir (not a bare path) so this venv's own .pth files (the editable
    # install of unattended) are read too.
    Path(overlay, "zz-unattended-base.pth").write_text(
        f"import site; site.addsitedir({base!r})\n", encoding="utf-8"
    )
    requirement = "rhapsody-py[radical-pilot]>=0.6,<0.7"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", requirement],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if install.returncode != 0:
        errors = [line for line in install.stderr.splitlines() if "is ignored" not in line]
        pytest.fail(
            f"pip install {requirement!r} into the RADICAL-Pilot overlay venv exited "
            f"{install.returncode}: " + "\n".join(errors[-10:] or ["no output"])
        )
    check = subprocess.run([str(python), "-m", "pip", "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    return python
