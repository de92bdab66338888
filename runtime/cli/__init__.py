"""The ``kdb`` command line: a thin typer layer over the kdb and runtime APIs."""
