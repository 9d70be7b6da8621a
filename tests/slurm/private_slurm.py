"""A private Slurm of one node (or several) under one folder, started and stopped without systemd.

Used by ``tests/slurm/conftest.py`` (one cluster per test session) and by
``benchmarks/slurm.py``. Everything lives under ``root``: the munge key and socket,
``slurm.conf``, state, spool, pid and log files, the job-completion log. The daemons
listen on 127.0.0.1 only, on ports that were free when the cluster started, so a
developer's own Slurm (default ports 6817/6818) is not disturbed.

What the configuration is built on is measured in ``ARCHITECTURE.md`` ("A real Slurm
on this machine"). Slurm 22.05 does not export ``SLURM_JOB_END_TIME`` (23.02 does):
a ``TaskProlog`` exports it, and ``SLURM_JOB_START_TIME``, from ``squeue``.

``start_cluster(root, nodes=3)`` starts three nodes ``n1``-``n3`` on this one host,
each its own ``slurmd -N nX`` on its own port (``ARCHITECTURE.md``, "Several Slurm
nodes on one machine"); killing one node's slurmd is a node failure among peers. The
default, one node named after the host, is the cluster every other test uses.

Usage::

    failure = ensure_slurm_installed()      # None, or why it cannot be
    cluster = start_cluster(tmp_dir)        # raises SlurmStartFailed
    cluster.run(["sbatch", "--wrap", "true"])
    cluster.stop()                          # scancel everything, kill daemons by pid file
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: apt_get

from apt_get import apt_install  # type: ignore[import-not-found]  # after the path

#: The Debian packages, and the programs the cluster needs from them.
PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
_APT_TIMEOUT = 600.0
_START_TIMEOUT = 60.0


class SlurmStartFailed(RuntimeError):  # noqa: N818  # names what happened, like the taxonomy
    """The private cluster did not come up; the message names the step and the log."""


def missing_programs() -> list[str]:
    """Return the Slurm and munge programs not found on PATH (or in /usr/sbin)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"])
    return [name for name in DAEMONS + CLIENTS if shutil.which(name, path=path) is None]


def ensure_slurm_installed() -> str | None:
    """Return None when Slurm and munge can run here, else the reason they cannot.

    Installs the Debian packages with apt-get when programs are missing. The
    daemons run jobs as their submitting user, so a private cluster needs root.
    """
    if os.geteuid() != 0:
        return "a private slurmd must run as root (it starts jobs as their user)"
    if missing_programs():
        failure = apt_install(PACKAGES, _APT_TIMEOUT)
        if failure is not None:
            return failure
        still = missing_programs()
        if still:
            return f"installed {' '.join(PACKAGES)} but {', '.join(still)} is still missing"
    return None


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def free_ports_in_a_row(count: int, *, avoid: int = 0) -> int:
    """Return the first of ``count`` consecutive free ports on 127.0.0.1 (none is ``avoid``)."""
    for _ in range(100):
        first = free_port()
        wanted = range(first, first + count)
        if avoid in wanted or wanted[-1] > 65535:
            continue
        try:
            with contextlib.ExitStack() as held:
                for port in wanted:
                    probe = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first
    raise SlurmStartFailed(f"found no {count} free ports in a row on 127.0.0.1")


def _memory_mb() -> int:
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 1024


_TASK_PROLOG = """#!/bin/sh
# Slurm 22.05 does not export SLURM_JOB_END_TIME / SLURM_JOB_START_TIME (23.02 does).
# A TaskProlog's "export NAME=value" lines reach every task of the job.
set -- $(SLURM_CONF={conf} {squeue} -h -j "$SLURM_JOB_ID" -o '%S %e' 2>/dev/null)
for pair in "SLURM_JOB_START_TIME $1" "SLURM_JOB_END_TIME $2"; do
    name=${{pair%% *}}; when=${{pair#* }}
    case "$when" in ""|N/A|Unknown|None) continue;; esac
    epoch=$(date -d "$when" +%s 2>/dev/null) && echo "export $name=$epoch"
done
exit 0
"""


def slurm_conf(
    root: Path,
    *,
    host: str,
    ctld_port: int,
    slurmd_port: int,
    cpus: int,
    memory_mb: int,
    munge_socket: Path,
    task_prolog: Path,
    slurmd_timeout: int = 30,
    nodes: int = 1,
) -> str:
    """Return the slurm.conf of a cluster living under ``root``.

    ``slurmd_timeout`` is how long the controller waits for a silent slurmd before
    it sets the node DOWN and fails its jobs (``NODE_FAIL``). With ``nodes`` > 1 the
    nodes are ``n1``..``nN`` on this host, on ports ``slurmd_port``.. onwards, each
    with ``cpus`` CPUs; one node is named after the host, as before.
    """
    overrides = ["SlurmdParameters=config_overrides"] if cpus != (os.cpu_count() or 1) else []
    # Several slurmd on one host: each its own spool, pid and log file (%n: node name).
    node_part, pid_part = ("%n", "-%n") if nodes > 1 else ("", "")
    if nodes > 1:
        last = slurmd_port + nodes - 1
        node_lines = [
            f"NodeName=n[1-{nodes}] NodeHostname={host} NodeAddr=127.0.0.1 "
            f"Port=[{slurmd_port}-{last}] CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN",
            f"PartitionName=debug Nodes=n[1-{nodes}] Default=YES MaxTime=INFINITE State=UP",
        ]
    else:
        node_lines = [
            f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN",
            f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP",
        ]
    lines = [
        f"# A private {nodes}-node cluster for tests (tests/slurm/private_slurm.py).",
        "ClusterName=unattended",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        # Listen on 127.0.0.1, not 0.0.0.0 (checked with `ss -ltnp`).
        "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool' / node_part}",
        f"SlurmctldPidFile={root / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'run' / f'slurmd{pid_part}.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / f'slurmd{pid_part}.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        # sbatch -> running in 0.7-1 s instead of ~3 s.
        "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0",
        # A job log without accounting: how each job ended (TIMEOUT, CANCELLED, ...).
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={root / 'log' / 'jobcomp.txt'}",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "ReturnToService=2",
        "OverTimeLimit=0",
        "KillWait=5",
        "MinJobAge=600",
        "InactiveLimit=0",
        "SlurmctldTimeout=30",
        f"SlurmdTimeout={slurmd_timeout}",
        f"TaskProlog={task_prolog}",
        *overrides,
        *node_lines,
    ]
    return "\n".join(lines) + "\n"


@dataclass
class SlurmCluster:
    """A running private cluster: its folder, config, host, nodes and client environment.

    ``nodes`` are the node names (one named after the host, or ``n1``..``nN``);
    ``cpus`` is per node.
    """

    root: Path
    conf: Path
    host: str
    cpus: int
    ctld_port: int
    slurmd_port: int
    env: dict[str, str] = field(default_factory=dict)
    nodes: tuple[str, ...] = ()
    _stopped: bool = False

    def __post_init__(self) -> None:
        if not self.nodes:
            self.nodes = (self.host,)

    def _node_files(self, node: str | None) -> tuple[str, Path, Path, Path]:
        """Return a node's name, pid file, log file and spool folder (default: the first)."""
        name = node or self.nodes[0]
        if name not in self.nodes:
            raise SlurmStartFailed(f"no node {name!r} in this cluster ({', '.join(self.nodes)})")
        if len(self.nodes) == 1:
            return (
                name,
                self.root / "run" / "slurmd.pid",
                self.root / "log" / "slurmd.log",
                (self.root / "spool"),
            )
        return (
            name,
            self.root / "run" / f"slurmd-{name}.pid",
            self.root / "log" / f"slurmd-{name}.log",
            self.root / "spool" / name,
        )

    @property
    def jobcomp(self) -> Path:
        """Return the job-completion log (one line per finished job)."""
        return self.root / "log" / "jobcomp.txt"

    def run(
        self, argv: Sequence[str], *, timeout: float = 30.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster."""
        done = subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and done.returncode != 0:
            raise SlurmStartFailed(
                f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-400:]}"
            )
        return done

    def job_ids(self) -> list[str]:
        """Return the ids of every job the controller still lists as pending or running."""
        done = self.run(["squeue", "-h", "-o", "%i"], check=False)
        return [line.strip() for line in done.stdout.splitlines() if line.strip()]

    def node_state(self) -> str:
        """Return the node's state as sinfo prints it (idle, mixed, alloc, down, ...).

        With several nodes: one line per node.
        """
        done = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False)
        return done.stdout.strip().lower()

    def node_states(self) -> dict[str, str]:
        """Return each node's state by name (``{"n1": "idle", "n2": "down*", ...}``)."""
        done = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False)
        pairs = (line.split() for line in done.stdout.splitlines())
        return {pair[0]: pair[1].lower() for pair in pairs if len(pair) == 2}

    def cancel_all(self, *, wait: float = 20.0) -> None:
        """Cancel every job and wait (bounded) until none is pending or running."""
        ids = self.job_ids()
        if ids:
            self.run(["scancel", *ids], check=False)
        deadline = time.monotonic() + wait
        while self.job_ids() and time.monotonic() < deadline:
            time.sleep(0.3)

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Wait until no job is listed and the node is idle."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.job_ids() and set(self.node_state().splitlines()) == {"idle"}:
                return
            time.sleep(0.3)
        raise SlurmStartFailed(f"nodes not idle after {timeout:.0f} s: {self.node_state()!r}")

    def kill_slurmd(self, node: str | None = None) -> int:
        """SIGKILL a node's slurmd (half-dying: its jobs' processes live on); return its pid."""
        name, pid_file, _, _ = self._node_files(node)
        pid = _read_pid(pid_file)
        if pid is None or not _alive(pid):
            raise SlurmStartFailed(f"slurmd of {name} is not running")
        os.kill(pid, signal.SIGKILL)
        while _alive(pid):
            time.sleep(0.05)
        return pid

    def kill_node(self, node: str) -> list[int]:
        """SIGKILL a node whole: its slurmd, its jobs' processes and their slurmstepd.

        The jobs' processes are those whose environment names this cluster
        (``SLURM_CONF``) and this node (``SLURMD_NODENAME``); their ``slurmstepd``
        parents go too. Returns the pids killed besides slurmd's.
        """
        self.kill_slurmd(node)
        conf = f"SLURM_CONF={self.conf}".encode()
        name = f"SLURMD_NODENAME={node}".encode()
        doomed: set[int] = set()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
                stat = Path(f"/proc/{entry}/stat").read_text("ascii", errors="replace")
            except OSError:
                continue
            if conf in environ and name in environ:
                doomed.add(int(entry))
                parent = int(stat.rsplit(")", 1)[1].split()[1])
                try:
                    command = Path(f"/proc/{parent}/cmdline").read_bytes()
                except OSError:
                    continue
                if command.startswith(b"slurmstepd"):
                    doomed.add(parent)
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        while any(_alive(pid) for pid in doomed):
            time.sleep(0.05)
        # The killed slurmstepd left their sockets: gone as after a reboot, so the
        # restarted slurmd does not wait on steps that no longer exist.
        for socket_file in self._node_files(node)[3].glob(f"{node}_*"):
            socket_file.unlink(missing_ok=True)
        return sorted(doomed)

    def start_slurmd(self, node: str | None = None, timeout: float = _START_TIMEOUT) -> None:
        """Start a node's slurmd (after ``kill_slurmd``); it registers with the controller."""
        name, pid_file, log, spool = self._node_files(node)
        spool.mkdir(parents=True, exist_ok=True)
        pid_file.unlink(missing_ok=True)
        _daemon([_program("slurmd"), "-f", str(self.conf), "-N", name], log)
        _wait_for(pid_file, f"slurmd of {name}", timeout, log)

    def stop_controller(self) -> None:
        """SIGTERM slurmctld and wait until it is gone (its state stays on disk).

        Clients then get no answer ("Unable to contact slurm controller"); the jobs
        run on under their slurmd, as during a controller restart or failover.
        """
        pid_file = self.root / "run" / "slurmctld.pid"
        pid = _read_pid(pid_file)
        if pid is None or not _alive(pid):
            raise SlurmStartFailed("slurmctld is not running")
        _kill_by_pid_file(pid_file)
        if _alive(pid):
            raise SlurmStartFailed(f"slurmctld {pid} did not stop")

    def start_controller(self, timeout: float = _START_TIMEOUT) -> None:
        """Start slurmctld again from its saved state (after ``stop_controller``)."""
        pid_file = self.root / "run" / "slurmctld.pid"
        log = self.root / "log" / "slurmctld.log"
        pid_file.unlink(missing_ok=True)
        _daemon([_program("slurmctld"), "-f", str(self.conf)], log)
        _wait_for(pid_file, "slurmctld", timeout, log)
        deadline = time.monotonic() + timeout
        while self.run(["squeue", "-h"], check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise SlurmStartFailed(f"slurmctld answers nothing after a restart (log: {log})")
            time.sleep(0.2)

    def wait_steps_ended(self, timeout: float = 60.0) -> None:
        """Wait until no job step runs on the node (slurmstepd's sockets are gone).

        A job the controller failed (``NODE_FAIL``) while slurmd was dead is cleaned
        up only once slurmd is back: stopping the daemons earlier would leave its
        slurmstepd behind.
        """
        spools = [self._node_files(node)[3] for node in self.nodes]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not any(
                list(spool.glob(f"{node}_*"))
                for node, spool in zip(self.nodes, spools, strict=True)
            ):
                return
            time.sleep(0.2)
        raise SlurmStartFailed(f"job steps still on the node after {timeout:.0f} s")

    def stop(self) -> None:
        """Cancel every job, then stop slurmd, slurmctld and munged by their pid files."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self.cancel_all()
        finally:
            for node in self.nodes:
                _kill_by_pid_file(self._node_files(node)[1])
            for name in ("slurmctld", "munged"):
                _kill_by_pid_file(self.root / "run" / f"{name}.pid")


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _kill_by_pid_file(path: Path, grace: float = 10.0) -> None:
    """SIGTERM the process a pid file names, then SIGKILL it after ``grace`` seconds."""
    pid = _read_pid(path)
    if pid is None or not _alive(pid):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return


def _daemon(argv: list[str], log: Path) -> None:
    """Start a daemon that forks into the background; fail naming its log."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30.0, check=False)
    if done.returncode != 0:
        raise SlurmStartFailed(
            f"{Path(argv[0]).name} exited {done.returncode}: "
            f"{(done.stderr or done.stdout).strip()[-400:]} (log: {log})"
        )


def _wait_for(path: Path, what: str, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = _read_pid(path) if path.suffix == ".pid" else None
        if (path.suffix == ".pid" and pid is not None and _alive(pid)) or (
            path.suffix != ".pid" and path.exists()
        ):
            return
        time.sleep(0.05)
    raise SlurmStartFailed(f"{what} did not start within {timeout:.0f} s (log: {log})")


def _program(name: str) -> str:
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"])
    found = shutil.which(name, path=path)
    if found is None:
        raise SlurmStartFailed(f"{name} not found; install {' '.join(PACKAGES)}")
    return found


def client_env(conf: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return ``base`` (the process environment) for clients of the cluster at ``conf``.

    ``SLURM_*`` variables of an enclosing job are dropped, so a test run inside
    someone's allocation does not mistake that job for its own.
    """
    source = os.environ if base is None else base
    env = {key: value for key, value in source.items() if not key.startswith("SLURM_")}
    env["SLURM_CONF"] = str(conf)
    return env


def start_cluster(
    root: Path,
    *,
    cpus: int | None = None,
    timeout: float = _START_TIMEOUT,
    slurmd_timeout: int = 30,
    nodes: int = 1,
) -> SlurmCluster:
    """Start munged, slurmctld and slurmd under ``root``; run a probe job; return the cluster.

    Args:
        root: An empty folder that holds everything of the cluster.
        cpus: CPUs the node offers (default: this machine's). More than the
            machine has is allowed (``SlurmdParameters=config_overrides``).
        timeout: Seconds each step may take.
        slurmd_timeout: ``SlurmdTimeout``: seconds without an answer from slurmd
            before the node is DOWN and its jobs end ``NODE_FAIL``.
        nodes: How many nodes, each its own slurmd with ``cpus`` CPUs: one (named
            after the host) by default, else ``n1``..``nN``.

    Raises:
        SlurmStartFailed: A daemon or the probe job failed; the message names the log.
    """
    root = root.resolve()
    for sub in ("munge", "state", "spool", "run", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "munge", 0o700)
    host = socket.gethostname().split(".")[0]
    cpus = cpus or os.cpu_count() or 1
    munge_socket = root / "munge" / "munge.socket.2"
    key = root / "munge" / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    os.chmod(key, 0o400)
    prolog = root / "task_prolog.sh"
    conf = root / "slurm.conf"
    prolog.write_text(_TASK_PROLOG.format(conf=conf, squeue=_program("squeue")), encoding="ascii")
    os.chmod(prolog, 0o755)
    if nodes < 1:
        raise SlurmStartFailed(f"nodes must be at least 1, not {nodes}")
    ctld_port = free_port()
    slurmd_port = free_ports_in_a_row(nodes, avoid=ctld_port)
    conf.write_text(
        slurm_conf(
            root,
            host=host,
            ctld_port=ctld_port,
            slurmd_port=slurmd_port,
            cpus=cpus,
            memory_mb=max(256, int(_memory_mb() * 0.8)),
            munge_socket=munge_socket,
            task_prolog=prolog,
            slurmd_timeout=slurmd_timeout,
            nodes=nodes,
        ),
        encoding="ascii",
    )
    cluster = SlurmCluster(
        root=root,
        conf=conf,
        host=host,
        cpus=cpus,
        ctld_port=ctld_port,
        slurmd_port=slurmd_port,
        env=client_env(conf),
        nodes=(host,) if nodes == 1 else tuple(f"n{k}" for k in range(1, nodes + 1)),
    )
    log = root / "log"
    try:
        _daemon(
            [
                _program("munged"),
                "--force",
                f"--key-file={key}",
                f"--socket={munge_socket}",
                f"--pid-file={root / 'run' / 'munged.pid'}",
                f"--log-file={log / 'munged.log'}",
                f"--seed-file={root / 'munge' / 'munged.seed'}",
            ],
            log / "munged.log",
        )
        _wait_for(munge_socket, "munged", timeout, log / "munged.log")
        _daemon([_program("slurmctld"), "-f", str(conf), "-i"], log / "slurmctld.log")
        _wait_for(root / "run" / "slurmctld.pid", "slurmctld", timeout, log / "slurmctld.log")
        for node in cluster.nodes:
            cluster.start_slurmd(node, timeout)
        cluster.wait_idle(timeout)
        # The first job after a fresh start takes ~3.5 s; later ones ~1 s.
        cluster.run(["srun", f"-N{nodes}", f"-n{nodes}", "-t", "1", "true"], timeout=timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def slurm_local_site(**changes: Any) -> Any:
    """Return ``site-configs/slurm-local.toml`` with dotted changes (``scheduler__walltime``)."""
    from tasks import SiteConfig, load_site

    data = load_site("slurm-local", env={}).model_dump(mode="json")
    for dotted, value in changes.items():
        target = data
        parts = dotted.split("__")
        for part in parts[:-1]:
            target = target[part]
        target[parts[-1]] = value
    if "retry_backoff" not in changes:
        data["retry_backoff"] = 0.0  # tests need no backoff between retries
    return SiteConfig.model_validate(data)


def load_cluster(root: Path) -> SlurmCluster:
    """Return the cluster a previous ``start_cluster(root)`` left running (for ``stop``)."""
    root = root.resolve()
    conf = root / "slurm.conf"
    values: dict[str, str] = {}
    for line in conf.read_text(encoding="ascii").splitlines():
        if "=" in line and not line.startswith("#"):
            name, _, value = line.partition("=")
            values.setdefault(name, value)
    host = values["SlurmctldHost"].split("(")[0]
    node_name = values["NodeName"].split()[0]
    count = int(node_name.split("-")[1].rstrip("]")) if node_name.startswith("n[1-") else 1
    return SlurmCluster(
        root=root,
        conf=conf,
        host=host,
        cpus=int(values["NodeName"].split("CPUs=")[1].split()[0]),
        ctld_port=int(values["SlurmctldPort"]),
        slurmd_port=int(values["SlurmdPort"]),
        env=client_env(conf),
        nodes=(host,) if count == 1 else tuple(f"n{k}" for k in range(1, count + 1)),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python tests/slurm/private_slurm.py start|stop DIR``: a private cluster by hand."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("root", type=Path)
    parser.add_argument("--cpus", type=int, default=None, help="CPUs per node")
    parser.add_argument("--nodes", type=int, default=1, help="slurmd daemons (n1..nN)")
    args = parser.parse_args(argv)
    if args.action == "start":
        failure = ensure_slurm_installed()
        if failure is not None:
            print(f"cannot start Slurm here: {failure}")
            return 1
        cluster = start_cluster(args.root, cpus=args.cpus, nodes=args.nodes)
        print(f"export SLURM_CONF={cluster.conf}")
        return 0
    load_cluster(args.root).stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
