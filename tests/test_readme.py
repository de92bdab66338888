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


def test_the_python_example_runs_as_written(tmp_path):
    import os
    import subprocess
    import sys

    section = (ROOT / "README.md").read_text().split("\n### Run\n", 1)[1].split("\n#", 1)[0]
    (example,) = re.findall(r"```python\n(.*?)\n```", section, re.S)
    assert "launch(" in example and "assert" in example  # it runs a kernel and checks the result
    env = {k: v for k, v in os.environ.items() if not k.startswith("KDB_")}
    env.update(KDB_CUSTOM_CACHE_DIR=str(tmp_path / "cache"), KDB_SYSTEM_DB_PATH=str(tmp_path / "system"))
    proc = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() in ("system", "user", "jit")


def test_the_primitives_example_runs_as_written(tmp_path):
    import os
    import subprocess
    import sys

    section = (ROOT / "README.md").read_text().split("## The primitives", 1)[1].split("\n## ", 1)[0]
    (example,) = re.findall(r"```python\n(.*?)\n```", section, re.S)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KDB_")}
    env.update(KDB_CUSTOM_CACHE_DIR=str(tmp_path / "cache"), KDB_SYSTEM_DB_PATH=str(tmp_path / "system"),
               KDB_USER_DB_PATH=str(tmp_path / "userdb"))
    proc = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
