"""Is a results file older than the code it measures?

Each results file records the commit it was produced at (``bench/record.py``); each benchmark declares the source
it measures (``Benchmark.measures`` in ``bench/__main__.py``, plus its own module). A results file is

- ``fresh`` when none of that source changed between its commit and ``HEAD``;
- ``stale`` when some did: the figures may no longer be what the code does (re-run the benchmark on a quiet
  machine and commit the file);
- ``missing`` when its commit is not in this repository's history, or is not an ancestor of ``HEAD`` (recorded
  on a branch that was rewritten or never merged): the file cannot be traced to the code at all;
- ``unknown`` when git cannot say (no git, or a shallow clone without the commit).

"Changed" compares content, not paths, so that moving a package does not age every figure: a file renamed
unchanged does not count, and neither does one whose Python differs only in its imports, docstrings and comments
(the syntax trees compared without them; ``leasing.scheduler`` becoming ``broker.scheduler`` changes imports
only). Any other edit of a measured file counts, however small: staleness says "look again", not "wrong".
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

FRESH, STALE, MISSING, UNKNOWN = "fresh", "stale", "missing", "unknown"


@dataclass(frozen=True)
class Freshness:
    """What became of the code behind one results file since it was recorded."""

    name: str  # the results file's stem
    commit: str
    state: str  # FRESH, STALE, MISSING or UNKNOWN
    changed: tuple[str, ...] = field(default=())  # measured files whose content changed (paths at HEAD)
    detail: str = ""

    def line(self) -> str:
        """One line for a person: the file, its state and why."""
        head = f"bench/results/{self.name}.json ({self.commit[:10]}): {self.state}"
        if self.state == STALE:
            shown = ", ".join(self.changed[:4]) + (f" and {len(self.changed) - 4} more" if len(self.changed) > 4
                                                   else "")
            return f"{head}: the code it measures changed since: {shown}"
        return f"{head}: {self.detail}" if self.detail else head


class _Git:
    """The few git questions asked, cached per repository (one diff per recorded commit)."""

    def __init__(self, root: Path):
        self.root = root

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=self.root, capture_output=True, text=True, check=False)

    @cache  # noqa: B019  (one per repository, for the life of the process)
    def shallow(self) -> bool:
        return self.run("rev-parse", "--is-shallow-repository").stdout.strip() == "true"

    @cache  # noqa: B019
    def has_commit(self, commit: str) -> bool:
        return self.run("cat-file", "-e", f"{commit}^{{commit}}").returncode == 0

    @cache  # noqa: B019
    def is_ancestor(self, commit: str, head: str) -> bool:
        return self.run("merge-base", "--is-ancestor", commit, head).returncode == 0

    @cache  # noqa: B019
    def changes(self, commit: str, head: str) -> tuple[tuple[str, str, str], ...]:
        """(status, path at the commit, path at ``head``) of every file that differs, renames detected."""
        done = self.run("diff", "--name-status", "-M", "-z", commit, head)
        if done.returncode != 0:
            raise OSError(done.stderr.strip() or "git diff failed")
        parts, out, i = done.stdout.split("\0"), [], 0
        while i < len(parts) and parts[i]:
            status = parts[i]
            if status[0] in "RC":
                out.append((status, parts[i + 1], parts[i + 2]))
                i += 3
            else:
                out.append((status, parts[i + 1], parts[i + 1]))
                i += 2
        return tuple(out)

    @cache  # noqa: B019
    def moved_folders(self, commit: str, head: str) -> dict[str, str]:
        """Folders moved since ``commit`` (``leasing/sim`` → ``bench/sim``): for each old folder of a file git saw
        renamed, the new folder most of its files went to."""
        votes: dict[str, dict[str, int]] = {}
        for status, old, new in self.changes(commit, head):
            old_dir, new_dir = old.rpartition("/")[0], new.rpartition("/")[0]
            if status[0] == "R" and old_dir != new_dir and old_dir and new_dir:
                counts = votes.setdefault(old_dir, {})
                counts[new_dir] = counts.get(new_dir, 0) + 1
        return {old: max(counts, key=lambda d: (counts[d], d)) for old, counts in votes.items()}

    def renames(self, commit: str, head: str) -> dict[str, str]:
        """The moved folders as module prefixes (``leasing.sim`` → ``bench.sim``)."""
        return {old.replace("/", "."): new.replace("/", ".") for old, new in self.moved_folders(commit, head).items()}

    def moved_from(self, commit: str, head: str, new: str) -> str | None:
        """For a file git calls added (too edited for its rename detection, as a small module whose imports
        changed): the same name in the folder that moved to its folder, if the commit has it."""
        folder, _, base = new.rpartition("/")
        for old_dir, new_dir in self.moved_folders(commit, head).items():
            if new_dir == folder and self.show(commit, f"{old_dir}/{base}") is not None:
                return f"{old_dir}/{base}"
        return None

    @cache  # noqa: B019
    def content_changed(self, commit: str, head: str, status: str, old: str, new: str) -> bool:
        if status.startswith("R100"):
            return False  # moved as it was
        if status[0] == "A" and (origin := self.moved_from(commit, head, new)) is not None:
            status, old = "M", origin
        if status[0] in "AD":
            return True
        before, after = self.show(commit, old), self.show(head, new)
        if before is None or after is None:
            return True
        if before == after:
            return False
        if not new.endswith(".py"):
            return True
        moved = self.renames(commit, head)
        if moved:  # the old source as if written after the move: its module names (code, strings) renamed
            # a module path only: ``leasing.sim`` anywhere, ``leasing`` only as the head of a dotted path (so the
            # word "fleet" in a sentence is not the old ``fleet`` package)
            alternatives = [re.escape(m) + (r"\b" if "." in m else r"(?=\.[A-Za-z_])")
                            for m in sorted(moved, key=len, reverse=True)]
            pattern = re.compile(r"(?<![\w.])(" + "|".join(alternatives) + ")")
            before = pattern.sub(lambda m: moved[m.group(1)], before.decode(errors="replace")).encode()
        old_code, new_code = _code_only(before), _code_only(after)
        return old_code is None or old_code != new_code

    @cache  # noqa: B019
    def show(self, commit: str, path: str) -> bytes | None:
        done = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=self.root, capture_output=True, check=False)
        return done.stdout if done.returncode == 0 else None


_REPOS: dict[Path, _Git] = {}


def _git(root: Path) -> _Git:
    return _REPOS.setdefault(root.resolve(), _Git(root.resolve()))


@cache
def _code_only(source: bytes) -> str | None:
    """The syntax tree without imports, docstrings and comments; None where it is not Python."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            statements = getattr(node, name, None)
            if not isinstance(statements, list):
                continue
            kept = [s for s in statements if not isinstance(s, (ast.Import, ast.ImportFrom))]
            if name == "body" and kept and isinstance(kept[0], ast.Expr) and isinstance(kept[0].value, ast.Constant) \
                    and isinstance(kept[0].value.value, str):
                kept = kept[1:]  # a docstring
            statements[:] = kept
    return ast.dump(tree, annotate_fields=False, include_attributes=False)


def _under(path: str, sources: tuple[str, ...]) -> bool:
    return any(path == source or path.startswith(source.rstrip("/") + "/") for source in sources)


def freshness(name: str, commit: str, sources: tuple[str, ...], *, root: Path) -> Freshness:
    """The state of the results file ``name`` recorded at ``commit``, measuring ``sources`` (paths relative to
    ``root``, files or folders, as they are named at ``HEAD``)."""
    git = _git(root)
    try:
        if git.run("rev-parse", "--git-dir").returncode != 0:
            return Freshness(name, commit, UNKNOWN, detail="not a git checkout")
        if len(commit) != 40 or not git.has_commit(commit):
            if git.shallow():
                return Freshness(name, commit, UNKNOWN, detail="a shallow clone without that commit")
            return Freshness(name, commit, MISSING, detail="its commit is not in this repository's history")
        head = git.run("rev-parse", "HEAD").stdout.strip()  # a commit id: the caches below never go stale
        if not git.is_ancestor(commit, head):
            if git.shallow():
                return Freshness(name, commit, UNKNOWN, detail="a shallow clone cannot tell its ancestry")
            return Freshness(name, commit, MISSING, detail="its commit is not an ancestor of HEAD (a rewritten or "
                                                           "unmerged branch)")
        changed = tuple(sorted(
            new for status, old, new in git.changes(commit, head)
            if (_under(new, sources) or (status[0] == "D" and _under(old, sources)))
            and git.content_changed(commit, head, status, old, new)))
    except OSError as error:  # git missing, or failing in a way the questions above did not foresee
        return Freshness(name, commit, UNKNOWN, detail=f"git could not say ({error})")
    return Freshness(name, commit, STALE if changed else FRESH, changed)


def results_freshness(name: str, *, root: Path, results: Path, sources: tuple[str, ...]) -> Freshness:
    """:func:`freshness` of ``<results>/<name>.json`` from the commit it records."""
    try:
        commit = str(json.loads((results / f"{name}.json").read_text()).get("commit", ""))
    except (OSError, ValueError) as error:
        return Freshness(name, "", UNKNOWN, detail=f"unreadable results file ({error})")
    return freshness(name, commit, sources, root=root)
