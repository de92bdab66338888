import pytest

from kdbkit.runtime.cli.app import main


@pytest.fixture
def kdb(capsys):
    """Run ``kdb ARGS...`` in-process; returns (exit code, stdout, stderr)."""
    def run(*args):
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err
    return run
