"""Every setting read from the environment is listed in ``.env.example`` (issue 29: it lacked 21 of the 81 read),
so the file README and docs/operations.md point to is the whole list. A name is read when ``config/settings.py``
(or another ``config/`` module) passes it to a ``config.env`` helper (``env_int("NAME", ...)``) or to
``os.environ.get`` / ``os.getenv``; it is listed as ``NAME=value`` or, for one that is derived or set by a
tool, as a comment ``# NAME=value``."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV_HELPERS = re.compile(r"^env_[a-z]+$")


def names_read(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        first = node.args[0]
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            continue
        function = node.func
        helper = isinstance(function, ast.Name) and ENV_HELPERS.match(function.id)
        environ = isinstance(function, ast.Attribute) and (
            (function.attr == "get" and isinstance(function.value, ast.Attribute) and function.value.attr == "environ")
            or function.attr == "getenv")
        if helper or environ:
            found.add(first.value)
    return found


def listed() -> set[str]:
    return set(re.findall(r"^(?:# ?)?([A-Z][A-Z0-9_]+)=", (ROOT / ".env.example").read_text(), re.MULTILINE))


def test_env_example_lists_every_setting_read_from_the_environment():
    read = set().union(*(names_read(path) for path in sorted((ROOT / "config").glob("*.py"))))
    assert len(read) > 80  # the reader sees the settings (a broken reader would pass with nothing to check)
    missing = sorted(read - listed())
    assert not missing, f".env.example lacks {len(missing)} of the {len(read)} settings read: {', '.join(missing)}"


def test_the_reader_finds_each_way_a_setting_is_read(tmp_path):
    sample = tmp_path / "settings.py"
    sample.write_text('import os\nA = env_int("ONE", 1)\nB = os.environ.get("TWO")\nC = os.getenv("THREE")\n'
                      'D = other("FOUR")\nE = os.environ["FIVE"]\n')
    assert names_read(sample) == {"ONE", "TWO", "THREE"}
