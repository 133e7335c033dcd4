"""Every command the README and ``docs/*.md`` show in their shell blocks is true to the code and run by a test
(issue 29: "every command and request in README and docs/*.md runs in the fresh-clone suite").

For each documented command line:
- a program of ours (``python -m agent…``, ``bench/*.py``, ``python -m bench…``, ``manage.py <command>``,
  ``gpubroker …``): every ``--flag`` it shows is one its ``--help`` lists (the docs cannot drift from the code),
  and the suite runs that program (its module, script, management command or CLI subcommand is named by a test or
  by a walk-through script the tests run);
- a shell line of the walk-throughs (``curl``, variables): it is in ``docs/walkthrough.sh`` or
  ``docs/walkthrough-workload.sh``, which tests run against a live service, or it is one of the tour's and the
  README's walk-through lines that tests/test_readme_walkthrough.py holds to the script (in the script's form);
- ``gpubroker`` lines: besides the flags, tests/client/test_cli.py runs docs/cli.md as a script and holds every
  ``gpubroker`` line of the docs to it;
- ``pytest`` lines: the paths exist;
- anything else is in ``ELSEWHERE`` below with the reason it does not run here."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from tests.test_readme_walkthrough import _readme_walkthrough

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SCRIPTS = [ROOT / "docs" / "walkthrough.sh", ROOT / "docs" / "walkthrough-workload.sh",
           ROOT / "docs" / "walkthrough-first-hour.sh"]
PYTHON = re.compile(r"^(?:\.venv/bin/)?python3?\s+")

# commands that do not run on this machine, each with why and what checks it instead
ELSEWHERE = {
    "make run": "the whole service: tests/test_run_first_hour.py starts `python -m infra.run` as make run does",
    "make test": "the suite itself (.ci/run calls it)",
    "kubectl": "needs a Kubernetes cluster; tests/deploy renders and checks the manifests under infra/k8s",
    "pg_dump": "the operator's backup of their own PostgreSQL (docs/operations.md); not our program",
    "createdb": "the operator's restore of their own PostgreSQL (docs/operations.md); not our program",
    "pg_restore": "the operator's restore of their own PostgreSQL (docs/operations.md); not our program",
    "sh bench/device_check.sh": "needs an NVIDIA GPU; tests/agent/test_hwcheck.py runs hwcheck's sim backend and "
                                "the script's dry run",
    "export ": "sets the environment for the lines after it",
    ".venv/bin/python -m agent.nvml_check": "needs the NVIDIA driver (no --help without it); "
                                           "tests/agent/test_nvml_backend.py runs it on the recorded H100's answers",
}
# shell lines that only set a variable or print one, in the walk-throughs' blocks
SHELL_ONLY = re.compile(r"^([A-Z_]+=\S*|printf |MONTH=|KEY=)")


def _logical(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.replace("\\\n", " ").splitlines()]


def documented() -> list[tuple[str, str]]:
    """(doc, command) for every command line of every sh/bash/console block."""
    found = []
    for doc in DOCS:
        for lang, block in re.findall(r"```(\w*)\n(.*?)```", doc.read_text(), re.S):
            if lang not in ("sh", "bash", "shell", "console"):
                continue
            for line in _logical(block):
                line = re.sub(r"^\$ ", "", re.sub(r"\s#\s.*$", "", line)).strip()
                for part in re.split(r"\s;\s|\s&&\s", line):  # one command at a time
                    if part.strip() and not line.startswith("#"):
                        found.append((doc.relative_to(ROOT).as_posix(), part.strip()))
    return found


@cache
def _script_lines() -> frozenset[str]:
    return frozenset(re.sub(r"\s#\s.*$", "", line).strip() for script in SCRIPTS
                     for line in _logical(script.read_text()))


@cache
def _test_sources() -> str:
    here = Path(__file__).resolve()
    texts = [path.read_text(errors="replace") for path in (ROOT / "tests").rglob("*.py") if path != here]
    return "\n".join(texts) + "\n".join(script.read_text() for script in SCRIPTS)


def program(command: str) -> tuple[list[str], list[str], str] | None:
    """(the argv that asks the program for help, the words after the program, how tests name it) for a command
    of ours; None for anything else. Words after the program: subcommands, then arguments."""
    command = re.sub(r"^(?:[A-Z_]+=\S+\s+)+", "", command)  # leading VAR=value assignments
    command = re.sub(r"^[A-Z_]+=\$\((.*)\)$", r"\1", command)  # LEASE=$(gpubroker …)
    try:
        words = shlex.split(command.replace("…", ""))
    except ValueError:
        return None
    if not words:
        return None
    if words[0] == "gpubroker":
        rest = words[1:]
        subs = [w for w in rest if not w.startswith("-")][:2]
        subs = [s for s in subs if re.fullmatch(r"[a-z-]+", s)]
        if subs and subs[0] != "lease":
            subs = subs[:1]
        return [sys.executable, "-m", "gpubroker_client", *subs, "--help"], rest, "gpubroker"
    if not PYTHON.match(command):
        return None
    words = words[1:]
    if words[:1] == ["manage.py"] and len(words) > 1:
        return [sys.executable, "manage.py", words[1], "--help"], words[2:], words[1]
    if words[:1] == ["-m"] and len(words) > 1:
        module, rest = words[1], words[2:]
        subs = [w for w in rest[:1] if re.fullmatch(r"[a-z][a-z_-]*", w)] if module.startswith("bench") else []
        return [sys.executable, "-m", module, *subs, "--help"], rest, module
    if words[0].startswith("bench/") and words[0].endswith(".py"):
        rest = words[1:]
        subs = [w for w in rest[:1] if re.fullmatch(r"[a-z][a-z_-]*", w)]
        return [sys.executable, words[0], *subs, "--help"], rest, Path(words[0]).stem
    return None


@cache
def _help(argv: tuple[str, ...]) -> str:
    done = subprocess.run(list(argv), cwd=ROOT, capture_output=True, text=True, timeout=120)
    return done.stdout + done.stderr


def test_docs_commands_are_true_to_the_code_and_run_by_a_test():
    commands = documented()
    assert len(commands) >= 50, commands  # the docs show this many today; a parser that finds none is broken
    problems, checked = [], 0
    walkthrough = set(_readme_walkthrough())
    for doc, command in commands:
        where = f"{doc}: {command[:120]}"
        if command.startswith("pytest") or ("-m pytest" in command):
            missing = [w for w in shlex.split(command)
                       if w.startswith("tests/") and not (ROOT / w.split("::")[0]).exists()]
            problems += [f"{where}: no such test path {m}" for m in missing]
            continue
        if any(command.startswith(prefix) for prefix in ELSEWHERE):
            continue
        if command in _script_lines() or command in walkthrough:
            continue  # run, as written, by a walk-through script a test runs against a live service
        ours = program(command)
        if ours is None:
            if not SHELL_ONLY.match(command):
                problems.append(f"{where}: neither ours, nor in a walk-through script, nor in ELSEWHERE")
            continue
        argv, rest, name = ours
        text = _help(tuple(argv))
        if argv[2:3] == ["gpubroker_client"]:
            text += _help((sys.executable, "-m", "gpubroker_client", "--help"))  # its global flags (--json)
        if "usage" not in text.lower() and "--help" not in text:
            problems.append(f"{where}: `{' '.join(argv[1:])}` shows no usage: {text[-300:]}")
            continue
        flags = {re.split(r"[=\[]", w)[0] for w in rest if w.startswith("--")}
        flags |= {f for w in rest for f in re.findall(r"\[(--[a-z][a-z-]*)", w)}
        unknown = sorted(f for f in flags if not re.search(re.escape(f) + r"(?![a-z-])", text))
        if unknown:
            problems.append(f"{where}: {', '.join(unknown)} not in `{' '.join(argv[1:])}`")
        if name not in _test_sources():
            problems.append(f"{where}: no test runs {name!r}")
        checked += 1
    assert not problems, "\n".join(problems)
    assert checked >= 30, checked


@pytest.mark.parametrize("command, expected", [
    (".venv/bin/python bench/billing.py --workers 2", ("bench/billing.py", ["--workers", "2"], "billing")),
    ("python manage.py tiering_seed --retrain", ("manage.py", ["--retrain"], "tiering_seed")),
    ("gpubroker lease logs \"$LEASE\" --follow", ("gpubroker_client", ["lease", "logs", "$LEASE", "--follow"],
                                                 "gpubroker")),
    (".venv/bin/python -m bench.sim quota --jobs x.csv", ("bench.sim", ["quota", "--jobs", "x.csv"], "bench.sim")),
])
def test_docs_commands_reads_a_command_as_its_program(command, expected):
    argv, rest, name = program(command)
    assert expected[0] in argv and argv[-1] == "--help" and rest == expected[1] and name == expected[2]
    assert program("curl -s http://x") is None and program("make run") is None
