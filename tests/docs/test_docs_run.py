"""Every console and Python block in README.md and docs/*.md runs as written.

Against the shipped examples, on one login node (``docs_shell`` in this folder's
conftest: the session's Prefect server, a state directory where both demos ran).

How a block is read, by its fence:

* ``bash``/``sh``/``shell``: a script, run by ``bash -e`` in a working directory that
  looks like the repository; it must exit 0.
* ``console``, or any fence whose first line starts with ``$ ``: lines starting with
  ``$ `` are commands (a trailing ``\\`` continues one), run in order by ``bash``; each
  must exit 0 (a doc that shows a failure ends the command with ``; echo "exit $?"`` and
  shows that line). The other lines are the output shown: each must appear, in order,
  as part of a line the commands printed (stdout and stderr together), after both
  sides are normalised (ids, times, dates, ports, pids, temporary paths and runs of
  spaces; see ``_normalise``). A line ``...`` shows that lines were left out, and
  ``...`` within a line stands for any text there (a version, a duration).
* ``python``: written to a file and run by the repository's venv in a subprocess; it
  must exit 0. When the prose between it and the next fence is ``prints`` (or ends
  with ``prints:``), that next block is its output, compared as above.

A block of any fence preceded by ``<!-- file: NAME -->`` (on the last non-blank line
before it) is a file the doc shows: it is written as ``NAME`` into the working directory,
for the blocks after it (a policy a replay uses, say).

A block that cannot run here carries, on the last non-blank line before its fence,
``<!-- not-run: WHY -->`` (for instance ``<!-- not-run: needs a real Slurm login node
-->``). Keep them few and each reason true.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from docs_shell import PROJECT, VENV_BIN, DocsShell

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600, func_only=False)]

DOCS = [PROJECT / "README.md", *sorted((PROJECT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")
_NOT_RUN = re.compile(r"^\s*<!--\s*not-run:\s*(?P<why>.+?)\s*-->\s*$")
_FILE = re.compile(r"^\s*<!--\s*file:\s*(?P<name>[\w.-]+?)\s*-->\s*$")
_SCRIPT = {"bash", "sh", "shell"}


@dataclass(frozen=True)
class Block:
    """One fenced block of a doc, as the test runs it."""

    path: Path
    line: int  # the fence's line number, from 1
    kind: str  # "script", "console", "python" or "file"
    body: tuple[str, ...]
    output: tuple[str, ...] | None  # a python block's output block, if the doc shows one
    not_run: str | None
    file_name: str | None = None  # where a "file" block is written

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(PROJECT)}:{self.line}"


def _fences(lines: list[str]) -> list[tuple[int, int, str]]:
    """Return (opening line, closing line, language) of each fenced block."""
    found, index = [], 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        close = index + 1
        while close < len(lines) and lines[close].strip() != "```":
            close += 1
        found.append((index, close, opening["lang"]))
        index = close + 1
    return found


def _dedent(body: list[str]) -> tuple[str, ...]:
    indent = min((len(x) - len(x.lstrip()) for x in body if x.strip()), default=0)
    return tuple(x[indent:] for x in body)


def collect(path: Path) -> list[Block]:
    """Return the runnable blocks of ``path``, in order."""
    lines = path.read_text().splitlines()
    fences = _fences(lines)
    blocks = []
    for number, (start, end, lang) in enumerate(fences):
        body = _dedent(lines[start + 1 : end])
        first = next((x for x in body if x.strip()), "")
        before = [x for x in lines[:start] if x.strip()]
        shown_file = _FILE.match(before[-1]) if before else None
        if shown_file is not None:
            blocks.append(Block(path, start + 1, "file", body, None, None, shown_file["name"]))
            continue
        if lang in _SCRIPT:
            kind = "script"
        elif lang == "console" or first.startswith("$ "):
            kind = "console"
        elif lang == "python":
            kind = "python"
        else:
            continue
        marker = _NOT_RUN.match(before[-1]) if before else None
        output = None
        if kind == "python" and number + 1 < len(fences):
            nxt_start, nxt_end, _ = fences[number + 1]
            prose = " ".join(x.strip() for x in lines[end + 1 : nxt_start] if x.strip())
            if prose == "prints" or prose.endswith("prints:"):
                output = _dedent(lines[nxt_start + 1 : nxt_end])
        blocks.append(Block(path, start + 1, kind, body, output, marker["why"] if marker else None))
    return blocks


BLOCKS = [block for path in DOCS for block in collect(path)]


def console_script(body: tuple[str, ...]) -> tuple[str, list[str]]:
    """Split a console block into its commands (as a script) and the output it shows."""
    commands: list[str] = []
    shown: list[str] = []
    continuing = False
    for line in body:
        if continuing or line.startswith("$ "):
            commands.append(line if continuing else line[2:])
            continuing = line.rstrip().endswith("\\")
            if not continuing:  # the whole command is in: stop at its failure
                commands.append("status=$?; [ $status -eq 0 ] || exit $status")
        elif line.strip():
            shown.append(line)
    return "\n".join(commands), shown


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_USER_HOME = re.compile(r"/home/[\w.-]+")
_SUBSTITUTIONS = [
    (
        re.compile(
            r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2}| UTC)?"
        ),
        "<when>",
    ),
    (re.compile(r"\b\d{2}:\d{2}:\d{2}\b"), "<time>"),
    (re.compile(r"127\.0\.0\.1:\d+"), "127.0.0.1:<port>"),
    (re.compile(r"\bpid \d+"), "pid <pid>"),
]


def _normalise(text: str, shell: DocsShell) -> str:
    for path, shown in ((shell.home.parent, "~"), (shell.workdir, ".")):
        text = text.replace(str(path), shown)
    text = _USER_HOME.sub("~", text)  # a doc's /home/ana is the test's temporary home
    text = _UUID.sub("<id>", text)
    for pattern, replacement in _SUBSTITUTIONS:
        text = pattern.sub(replacement, text)
    return " ".join(text.split())


def _contains(line: str, expected: str) -> bool:
    """Whether ``line`` holds ``expected``, where a ``...`` in it stands for any text."""
    start = 0
    for piece in expected.split("..."):
        found = line.find(piece.strip(), start)
        if found < 0:
            return False
        start = found + len(piece.strip())
    return True


def assert_shown(shown: list[str] | tuple[str, ...], printed: str, shell: DocsShell) -> None:
    """Assert each line ``shown`` appears, in order, within the lines ``printed``."""
    actual = [_normalise(line, shell) for line in printed.splitlines()]
    position = 0
    for line in shown:
        expected = _normalise(line, shell)
        if expected in ("", "..."):
            continue
        for index in range(position, len(actual)):
            if _contains(actual[index], expected):
                position = index + 1
                break
        else:
            raise AssertionError(
                f"the doc shows {line.strip()!r}, not printed (in order):\n{printed}"
            )


def run_block(block: Block, shell: DocsShell, tmp_path: Path) -> None:
    """Run ``block`` on the shell; raise AssertionError where it and the doc disagree."""
    if block.kind == "file":
        assert block.file_name is not None
        (shell.workdir / block.file_name).write_text("\n".join(block.body) + "\n")
        return
    if block.kind == "python":
        script = tmp_path / "block.py"
        script.write_text("\n".join(block.body) + "\n")
        done = shell.run([str(VENV_BIN / "python"), str(script)])
        shown = block.output
    else:
        text, shown_lines = (
            ("\n".join(block.body), None) if block.kind == "script" else console_script(block.body)
        )
        script = tmp_path / "block.sh"
        script.write_text(text + "\n")
        # A script stops at its first failure; a console block after each command, so
        # that `cmd; echo "exit $?"` shows a failure as the doc does.
        done = shell.run(["bash", *(["-e"] if block.kind == "script" else []), str(script)])
        shown = shown_lines
    assert done.returncode == 0, f"exited {done.returncode}:\n{done.stdout}"
    if shown:
        assert_shown(shown, done.stdout, shell)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_block_runs_as_written(block: Block, docs_shell: DocsShell, tmp_path: Path) -> None:
    if block.not_run is not None:
        pytest.skip(f"not run: {block.not_run}")
    run_block(block, docs_shell, tmp_path)


def test_a_console_block_has_a_command() -> None:
    """A ``console`` fence with no ``$ `` line would check nothing: give it another fence."""
    empty = [b.name for b in BLOCKS if b.kind == "console" and not console_script(b.body)[0]]
    assert empty == []


def test_drift_fails() -> None:
    """A command the doc shows with output it does not print fails the comparison."""
    shell = DocsShell(Path(sys.prefix), Path(sys.prefix), {})
    assert_shown(["campaign demo (4 rounds)"], "campaign  demo (4 rounds)\n", shell)
    with pytest.raises(AssertionError, match="not printed"):
        assert_shown(["campaign heat-sink"], "campaign demo\n", shell)


def test_a_failing_command_fails_its_console_block(tmp_path: Path) -> None:
    """A command that fails stops the block (its comment notwithstanding), unless shown."""
    script = tmp_path / "block.sh"
    script.write_text(console_script(("$ false   # a comment", "$ echo after"))[0])
    failed = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    assert (failed.returncode, failed.stdout) == (1, "")
    script.write_text(console_script(('$ false; echo "exit $?"', "exit 1"))[0])
    shown = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    assert (shown.returncode, shown.stdout) == (0, "exit 1\n")
