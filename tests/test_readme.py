"""README keeps exactly two set-up commands, and CI runs the second one verbatim."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setup_commands():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)\n```", section, re.S)


def test_two_setup_commands():
    main, tests = _setup_commands()
    assert "kdb demo" in main and "pytest" in tests


def test_ci_runs_the_readme_test_command():
    _, tests = _setup_commands()
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines()


def test_top_level_is_the_design_card():
    tracked = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")}
    assert {"pyproject.toml", "kdb", "packager", "runtime", "kernels", "scripts", "tests", "README.md"} <= tracked
