"""The README is a front door that stays true: at most 300 lines, every link resolves, every
`paraplan ...` command in it runs as written, and every output it shows is what the command
prints.

Commands are the inline code spans and code-block lines that start with `paraplan `; a code
block whose first line is `$ paraplan ...` shows that command's output below it ("..." marks
lines left out), and the output must appear in the command's, line by line and in order.
A command that reads a file missing here (../shared/ beside the checkout) is skipped, and
so, unless PARAPLAN_README_SLOW=1, is one that takes minutes.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 300
# Commands that take minutes on 2 cores; the README says how long.
SLOW = ("--cv source",)
# The search's wall time moves from run to run; nothing else in an output may.
SECONDS = re.compile(r"\bin \d+(\.\d+)? s\b")


def _blocks(text: str) -> list[list[str]]:
    """The fenced code blocks of a Markdown text, each as its lines."""
    blocks, current = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def _prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def readme_commands() -> list[tuple[str, list[str] | None]]:
    """Every `paraplan ...` command in the README, with the output it shows (None: none shown).

    The first two code blocks are the install and test commands (.ci/run reads the second);
    what comes before the end of the second is left to .ci/run."""
    text = README.read_text()
    # after the second block: the prose between the two names what the test command installs
    after = text.split("```", 4)[4]
    found: list[tuple[str, list[str] | None]] = []
    for block in _blocks(after):
        if block and block[0].startswith("$ paraplan "):
            found.append((block[0][2:], block[1:]))
            continue
        found += [(line, None) for line in block if line.startswith("paraplan ")]
    found += [(m.group(1), None) for m in re.finditer(r"`(paraplan [^`]+)`", _prose(after))]
    # each command once, with its output where the README shows it
    first: dict[str, list[str] | None] = {}
    for command, shown in found:
        if first.get(command) is None:
            first[command] = shown
    return list(first.items())


def _missing_input(argv: list[str]) -> str | None:
    for arg in argv:
        if ("/" in arg or arg.endswith((".csv", ".toml", ".json"))) and not (ROOT / arg).exists():
            return arg
    return None


def _run(command: str) -> subprocess.CompletedProcess:
    argv = shlex.split(command)
    assert argv[0] == "paraplan"
    missing = _missing_input(argv[1:])
    if missing:
        pytest.skip(f"{missing} is not beside this checkout")
    if any(s in command for s in SLOW) and not os.environ.get("PARAPLAN_README_SLOW"):
        pytest.skip("takes minutes; PARAPLAN_README_SLOW=1 runs it")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "paraplan", *argv[1:]], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


def _shown_in(shown: list[str], printed: str) -> str | None:
    """The first shown line that is not in the printed output after the previous one."""
    lines = [SECONDS.sub("in _ s", line) for line in printed.splitlines()]
    at = 0
    for line in shown:
        if line.strip() == "...":
            continue
        want = SECONDS.sub("in _ s", line)
        try:
            at = lines.index(want, at) + 1
        except ValueError:
            return line
    return None


COMMANDS = readme_commands()


def test_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines, at most {MAX_LINES}"
    assert len(COMMANDS) >= 3, "the README shows at least three worked examples"
    assert sum(shown is not None for _, shown in COMMANDS) >= 3


@pytest.mark.parametrize("doc", [README, *sorted((ROOT / "docs").rglob("*.md")), ROOT / "benchmarks" / "README.md"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path):
    text = doc.read_text()
    broken = []
    for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        path = (doc.parent / target).resolve()
        # ../shared/ lives beside the checkout, not in it
        if not path.exists() and ROOT.resolve() in path.parents:
            broken.append(target)
    assert not broken, f"{doc.name}: links to missing files {broken}"


@pytest.mark.parametrize("command,shown", COMMANDS, ids=[c for c, _ in COMMANDS])
def test_readme_command_runs_as_written(command: str, shown: list[str] | None):
    p = _run(command)
    assert p.returncode == 0, f"{command}\nexit {p.returncode}\n{p.stderr[-2000:]}"
    if shown is not None:
        missing = _shown_in(shown, p.stdout)
        assert missing is None, f"{command}: the README shows a line it no longer prints:\n{missing}"
