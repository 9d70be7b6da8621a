"""Check a campaign before anything runs: ``unattended check``, and first in submit and run.

Everything a submission needs is checked here, with no server and no Prefect:
the spec and the files it names (transcript, policy), the policy's rules (a
campaign with none must say so: ``allow_no_rules = true``; a rule that asks for
approval must name who may give it), the site config (no ``<PLACEHOLDER>`` left,
its backend's package installed, no task longer than its allocation's
walltime by its cost model, and where Slurm's commands are installed, a partition,
account and QoS Slurm knows), the simulation's program (found, a regular file,
executable) and the round-0 fallback batch. Every problem found is
returned, each naming the file and the dotted field; :func:`require_valid` raises
one error listing them all.

When everything else passes and it is cheap and local (or asked for), the
simulation runs once on that fallback batch's first candidate
(``flows._engine._check_run``): a run a batch would record as ``bad_output`` or
``task_failed`` is refused, naming the simulation and the code.

Relative paths in a spec (the site, the policy, the transcript, the simulation's
program) resolve against the spec's folder, whatever the current directory is: the
runner that executes the campaign runs elsewhere. Messages show the path as
written (``./sim.py``) and what it resolved to.

Over 500 lines: every check that ``check``, ``submit`` and ``run`` share is one list,
read top to bottom, so the three refuse the same things; ``flows`` holds at most twelve
modules at its top (``tests/project/test_architecture.py``), so a split makes this a package.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from flows._engine._campaign_state import build_surrogate, derive_seed
from flows._engine._check_run import check_run
from flows._engine._extension import FieldChange, is_extension, refused
from flows._engine._simulation import simulation_argv
from flows._paths import absolute, file_problem
from flows._settings import Settings
from flows._spec import LoadedSpec, Problem, is_site_path, problems_error, read_campaign
from policies import (
    FallbackUnavailable,
    Policy,
    Severity,
    SiteInvalid,
    SpecInvalid,
    load_policy,
)
from tasks import (
    Bounds,
    NotifyConfig,
    SiteConfig,
    fallback_batch,
    load_site,
    slurm_site_problems,
)


@dataclass(frozen=True)
class CheckedCampaign:
    """A campaign that passed every check, ready to submit."""

    loaded: LoadedSpec
    site: SiteConfig
    site_location: str  # what the flow is given: a site name, or an absolute path
    rules: int  # how many policy rules guard it
    # The fields this spec raises over the campaign recorded under its name (an extension).
    extension: tuple[FieldChange, ...] = ()


@dataclass(frozen=True)
class CheckReport:
    """What :func:`check_campaign` found: the campaign if it passed, and every problem."""

    checked: CheckedCampaign | None
    problems: list[Problem]
    site_only: bool = False  # every problem is in the site config (or naming it)


def check_campaign(
    spec_path: str | Path,
    site: str | None = None,
    env: Mapping[str, str] | None = None,
    *,
    run_simulation: bool | None = None,
) -> CheckReport:
    """Check a campaign as ``submit`` would, without a server; return every problem found.

    Args:
        spec_path: The campaign's TOML file.
        site: The ``--site`` option (a name or a path), overriding the spec's ``site``.
        env: Variables for the site's ``${VAR}`` and the simulation's ``PATH``;
            ``None`` means ``os.environ``.
        run_simulation: Run the simulation once on the first fallback candidate
            (True), or not (False); None follows the ``check_simulation`` setting.
    """
    environment = os.environ if env is None else env
    loaded, problems = read_campaign(spec_path)
    source = str(absolute(Path(spec_path)))
    site_problems: list[Problem] = []
    site_config, location = _site(loaded, source, site, environment, site_problems)
    if site_config is not None:
        _runnable_site(site_config, location, site_problems)
        _tasks_fit_walltime(site_config, location, loaded, site_problems)
        _slurm_knows_site(site_config, location, environment, site_problems)
        _notify_urls(site_config.notify, site_config.source or location, site_problems)
    rules = 0
    extension: list[FieldChange] = []
    if loaded is not None:
        if site_config is not None:
            extension = _against_record(loaded, site_config, environment, problems)
        _notify_urls(loaded.spec.notify, source, problems)
        rules = _rules(loaded, problems)
        _simulation(loaded, environment, problems)
        _fallback(loaded, problems)
        if not (problems or site_problems) and site_config is not None:
            # Last: only a campaign that passed everything else gets its program run.
            _simulation_runs(loaded, site_config, environment, run_simulation, problems)
    if problems or site_problems or loaded is None or site_config is None or location is None:
        return CheckReport(None, problems + site_problems, site_only=not problems)
    checked = CheckedCampaign(loaded, site_config, location, rules, tuple(extension))
    return CheckReport(checked, [])


def require_valid(
    spec_path: str | Path,
    site: str | None = None,
    env: Mapping[str, str] | None = None,
    *,
    run_simulation: bool | None = None,
) -> CheckedCampaign:
    """Return the checked campaign, or raise one error listing every problem.

    ``submit`` and ``run`` call this on every submission (a resubmission too), so
    by default they do not run the simulation: only ``check_simulation = "always"``
    (or ``run_simulation=True``) makes them. A bad output still fails its tasks.

    Raises:
        SiteInvalid: Only the site config is wrong.
        SpecInvalid: Anything else is (the spec, a file it names, the simulation), or
            a bad ``UNATTENDED_*`` variable.
    """
    if run_simulation is None:
        environment = os.environ if env is None else env
        run_simulation = Settings.from_env(environment).check_simulation == "always"
    report = check_campaign(spec_path, site, env, run_simulation=run_simulation)
    if report.checked is not None:
        return report.checked
    raise problems_error(report.problems, SiteInvalid if report.site_only else SpecInvalid)


def _site(
    loaded: LoadedSpec | None,
    source: str,
    option: str | None,
    env: Mapping[str, str],
    problems: list[Problem],
) -> tuple[SiteConfig | None, str | None]:
    """Load the site the campaign runs on (``--site``, else the spec's ``site``)."""
    if option is not None:
        where, field = "--site", None
        location = str(absolute(Path(option))) if is_site_path(option) else option
    elif loaded is not None:
        where, field = source, "site"
        location = loaded.site_location()
    else:
        return None, None  # the spec did not load: its site field is unknown
    if is_site_path(location):
        why = file_problem(Path(location))
        if why is not None:
            problems.append(Problem(where, field or "--site", _named(where, field, location, why)))
            return None, None
    try:
        return load_site(location, env=env), location
    except SiteInvalid as exc:
        file = exc.details.get("file")
        if file:  # the site file's own problem: it names the file and its fields
            problems.append(Problem(str(file), exc.details.get("field"), exc.message))
        else:  # a name that is not found: name who named it
            text = _named(where, field, None, exc.message)
            problems.append(Problem(where, field or "--site", text))
        return None, None


def _notify_urls(notify: NotifyConfig | None, source: str | None, problems: list[Problem]) -> None:
    """Refuse a ``[notify]`` URL that Apprise cannot use (named by index, never shown)."""
    if notify is None:
        return
    from flows._engine._notify import url_problem

    for index, url in enumerate(notify.urls):
        why = url_problem(url.get_secret_value())
        if why is not None:
            problems.append(Problem.at(source or "site", f"notify.urls[{index}]", why))


def _against_record(
    loaded: LoadedSpec, site: SiteConfig, env: Mapping[str, str], problems: list[Problem]
) -> list[FieldChange]:
    """Compare the spec with the one recorded under its name, as a submission will.

    Returns the fields an extension raises; another difference is a problem naming
    each field (``flows._engine._extension``).
    """
    changes = changes_against_record(loaded, site, env)
    if is_extension(changes) or not changes:
        return changes
    error = refused(loaded.spec.name, changes)
    problems.append(Problem.at(str(loaded.path), error.details["field"], error.message))
    return []


def changes_against_record(
    loaded: LoadedSpec, site: SiteConfig, env: Mapping[str, str]
) -> list[FieldChange]:
    """Return how the spec differs from the one recorded under its name, read-only.

    No record (or none readable) is no difference: the campaign is new, or the
    submission says what is wrong with its database.
    """
    from flows._engine._inputs import changes_from_record
    from flows._paths import campaign_dir, state_dir_from
    from flows._provenance._sqlite import open_read_only

    name = loaded.spec.name
    url = site.provenance_url
    if url is None:
        where: str | Path = campaign_dir(state_dir_from(None, env), name)
        if not (Path(where) / "provenance.db").exists():
            return []
    else:
        where = url.get_secret_value()
    try:
        with open_read_only(where) as store:
            if not any(row["name"] == name for row in store.campaigns()):
                return []
            recorded = store.summary(name)["campaign"]
    except Exception:  # noqa: BLE001  # unreadable: the submission reports its database
        return []
    return changes_from_record(recorded, loaded)


def _named(where: str, field: str | None, path: str | None, message: str) -> str:
    head = f"{where}: field '{field}'" if field else where
    return f"{head}: {path}: {message}" if path else f"{head}: {message}"


def _rules(loaded: LoadedSpec, problems: list[Problem]) -> int:
    """Return how many rules guard the campaign; without any it must opt in."""
    spec, source = loaded.spec, str(loaded.path)
    policy_file = loaded.resolve(spec.policy) if spec.policy else None
    if policy_file is not None and file_problem(policy_file) is not None:
        return 0  # reported already (read_campaign), and /dev/zero must not be read
    try:
        policy = load_policy(policy_file) if policy_file else None
    except SpecInvalid:
        return 0  # the broken policy file is reported already (read_campaign)
    count = len(policy.rules) if policy is not None else 0
    # The campaign's approvers answer for rules that name nobody.
    if policy is not None and policy_file is not None and not spec.approvals.approvers:
        _answerable(policy, policy_file, problems)
    if count == 0 and not spec.allow_no_rules:
        what = f"{policy_file} has no rules" if policy_file else "no policy file is given"
        problems.append(
            Problem.at(
                source,
                "policy",
                f"{what}, so only the budget and the round count would stop the campaign; "
                "add rules, or set allow_no_rules = true to run without any",
            )
        )
    return count


def _answerable(policy: Policy, policy_file: Path, problems: list[Problem]) -> None:
    """Refuse a rule that would ask for approval with nobody allowed to give it.

    The policy asks a rule's own ``approvers``, else the spec's ``[approvals]
    approvers`` (checked by the caller); with neither, the rule retries the round
    instead of asking, until the policy's retries run out and the campaign stops
    blocked.
    """
    escalates_to_ask = policy.escalate_to is Severity.ASK
    for rule in policy.rules:
        if rule.approvers or rule.log_only or policy.log_only:
            continue
        if rule.severity is Severity.ASK:
            how = "asks for approval"
        elif rule.severity is Severity.SOFT_BLOCK and escalates_to_ask:
            how = 'escalates to an approval (escalate_to = "ASK")'
        else:
            continue
        problems.append(
            Problem.at(
                str(policy_file),
                f"rules.{rule.name}.approvers",
                f"rule {rule.name!r} {how} but names no approvers, so nobody may answer: "
                "the round would be retried until the policy's retries run out and the "
                'campaign stop blocked; add approvers = ["NAME", ...] to the rule, or '
                "the campaign's [approvals] approvers to the spec",
            )
        )


# What a site's backend imports, and how to install it.
_BACKEND_PACKAGES: dict[str, tuple[str, str]] = {
    "jobqueue": ("dask_jobqueue", "pip install 'unattended[jobqueue]'"),
    "radical_pilot": ("radical.pilot", "pip install 'unattended[radical-pilot]'"),
    "postgres": ("psycopg", "pip install 'unattended[postgres]'"),
}


# `<YOUR_ALLOCATION>`, `source <YOUR_VENV>/bin/activate`, `...@<DB_HOST>/...`.
_PLACEHOLDER = re.compile(r"<[A-Z][A-Z0-9_]*>")


def _placeholders(site: SiteConfig) -> list[tuple[str, str]]:
    """Return (dotted field as written in the file, placeholder) for each one left unfilled."""
    if site.source is None:
        return [(field, "<...>") for field in site.placeholders()]
    try:
        raw = tomllib.loads(Path(site.source).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return []  # it loaded a moment ago; a file that changed since is the next run's news
    found: list[tuple[str, str]] = []

    def walk(value: object, path: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{path}.{key}" if path else str(key))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, f"{path}.{index}")
        elif isinstance(value, str):
            match = _PLACEHOLDER.search(value)
            if match:
                found.append((path, match.group()))

    walk(raw, "")
    return found


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent missing, or an import blocked with None
        return False


def _runnable_site(
    site: SiteConfig,
    location: str | None,
    problems: list[Problem],
    installed: Callable[[str], bool] = _installed,
) -> None:
    """Refuse a site with ``<PLACEHOLDER>`` values left, or whose backend is not installed."""
    file = site.source or location or site.name
    for field, placeholder in _placeholders(site):
        problems.append(
            Problem.at(file, field, f"still holds the placeholder {placeholder}: fill it in")
        )
    needed = []
    backend = site.backend
    if getattr(backend, "kind", None) == "dask" and getattr(backend, "jobqueue", None):
        needed.append(("backend.jobqueue", "jobqueue"))
    if getattr(backend, "kind", None) == "radical_pilot":
        needed.append(("backend.kind", "radical_pilot"))
    url = site.provenance_url.get_secret_value() if site.provenance_url is not None else ""
    if url.startswith("postgresql+psycopg"):
        needed.append(("provenance_url", "postgres"))
    for field, key in needed:
        module, install = _BACKEND_PACKAGES[key]
        if not installed(module):
            problems.append(
                Problem.at(
                    file,
                    field,
                    f"needs the Python package {module!r}, which is not installed here: {install}",
                )
            )


def _slurm_knows_site(
    site: SiteConfig, location: str | None, env: Mapping[str, str], problems: list[Problem]
) -> None:
    """Ask this machine's Slurm whether the site's partition, account and QoS exist."""
    file = site.source or location or site.name
    for field, message in slurm_site_problems(site, env):
        problems.append(Problem.at(file, field, message))


def _tasks_fit_walltime(
    site: SiteConfig, location: str | None, loaded: LoadedSpec | None, problems: list[Problem]
) -> None:
    """Refuse a campaign one of whose tasks is longer than an allocation: none could finish it.

    A task's duration is the site's cost model, as the walltime-aware launcher
    (``AllocationExecutor.ensure_time``) reads it: ``cost.simulation_seconds``, else
    ``cost.node_hours_per_simulation`` x 3600; for the verifier (when the spec sets
    ``objective.verifier_limit``) ``cost.verifier_seconds``, else
    ``cost.node_hours_per_verifier`` x 3600.
    """
    limit = site.allocation_limit()
    if limit is None:
        return
    limit_field, walltime, written = limit
    file = site.source or location or site.name
    cost = site.cost
    tasks = [
        (
            "simulation",
            site.batch_seconds(1),
            "cost.simulation_seconds",
            cost.simulation_seconds is not None,
            "cost.node_hours_per_simulation",
        )
    ]
    if loaded is not None and loaded.spec.objective.verifier_limit is not None:
        tasks.append(
            (
                "verifier",
                site.batch_seconds(0, verifiers=1),
                "cost.verifier_seconds",
                cost.verifier_seconds is not None,
                "cost.node_hours_per_verifier",
            )
        )
    for what, seconds, seconds_field, given, hours_field in tasks:
        if seconds <= walltime:
            continue
        field = seconds_field if given else hours_field
        source = field if given else f"{field} x 3600, as {seconds_field} is not set"
        problems.append(
            Problem.at(
                file,
                field,
                f"one {what} task takes {seconds:.0f} s by the site's cost model ({source}), "
                f"longer than the allocation's walltime {limit_field} = {written} "
                f"({walltime:.0f} s): no allocation could finish it; raise {limit_field} or "
                f"set {seconds_field} to what one {what} task really takes",
            )
        )


def _simulation(loaded: LoadedSpec, env: Mapping[str, str], problems: list[Problem]) -> None:
    """Check that the simulation's program exists and is executable, as the runner will see it.

    A program given as a relative path (``./sim.py``) resolves against the spec's folder.
    """
    program = simulation_argv(loaded)[0]
    written = loaded.spec.objective.simulation
    as_written = written[0] if isinstance(written, list | tuple) and written else program
    source, field = str(loaded.path), "objective.simulation"
    if "/" not in program:
        found = shutil.which(program, path=env.get("PATH", os.defpath))
        if found is None:
            problems.append(Problem.at(source, field, f"program {program!r} not found on PATH"))
        return
    path = Path(program)
    shown = str(path) if as_written == program else f"{as_written} (that is, {path})"
    why = file_problem(path)
    if why is not None:
        problems.append(Problem.at(source, field, f"{shown}: {why}"))
    elif not os.access(path, os.X_OK):
        problems.append(Problem.at(source, field, f"{shown}: is not executable"))


def _simulation_runs(
    loaded: LoadedSpec,
    site: SiteConfig,
    env: Mapping[str, str],
    run_simulation: bool | None,
    problems: list[Problem],
) -> None:
    """Run the simulation once on round 0's first fallback candidate, when it should.

    ``run_simulation`` (the ``--run-simulation`` option) wins; else the
    ``check_simulation`` setting: ``auto`` runs it when the site runs its tasks on
    this machine (no scheduler) and its cost model says one simulation takes at
    most ``check_simulation_seconds``, so a login node never runs a heavy one.
    """
    try:
        settings = Settings.from_env(env)
    except SpecInvalid as exc:
        problems.append(Problem.at("environment", exc.details.get("field"), exc.message))
        return
    seconds = settings.check_simulation_seconds
    if run_simulation is None:
        mode = settings.check_simulation
        cheap = site.scheduler.system == "none" and site.batch_seconds(1) <= seconds
        run_simulation = mode == "always" or (mode == "auto" and cheap)
    if not run_simulation:
        return
    spec = loaded.spec
    bounds = Bounds(lower=tuple(spec.objective.lower), upper=tuple(spec.objective.upper))
    first = fallback_batch(
        build_surrogate(), bounds, spec.batch_size, derive_seed(spec.seed, 0, 1)
    ).candidates[0]
    why = check_run(loaded, first, seconds)
    if why is not None:
        problems.append(Problem.at(str(loaded.path), "objective.simulation", why))


def _fallback(loaded: LoadedSpec, problems: list[Problem]) -> None:
    """Build round 0's fallback batch: a campaign that has none stops before spending anything."""
    spec = loaded.spec
    bounds = Bounds(lower=tuple(spec.objective.lower), upper=tuple(spec.objective.upper))
    try:
        fallback_batch(build_surrogate(), bounds, spec.batch_size, derive_seed(spec.seed, 0, 1))
    except FallbackUnavailable as exc:
        problems.append(
            Problem.at(
                str(loaded.path),
                "batch_size",
                f"no fallback batch of this size within the objective's bounds: {exc.message}",
            )
        )
    except SpecInvalid as exc:  # pragma: no cover - the spec's own checks come first
        problems.append(Problem.at(str(loaded.path), None, exc.message))
