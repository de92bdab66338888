"""``kdb keys ...``: the Ed25519 keys that sign cluster-cache entries (:mod:`kdbkit.kdb.signing`
does the work). The private key stays on the machines that publish; the public key goes to every
machine that reads, which then loads only what that key signed."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer
from rich.markup import escape

from kdbkit.runtime.cli.output import out, print_json

app = typer.Typer(help="Make the keys that sign cluster-cache entries.", no_args_is_help=True)


@app.command("new")
def new(output: Path = typer.Option(..., "-o", "--out", help="Folder for kdb-signing.key (mode 0600) and "
                                    "kdb-signing.pub (made 0700 where missing).", show_default=False),
        as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts.")) -> None:
    """Make a signing key pair and print its key id and the settings that use it. Never replaces a key file.

    Example: kdb keys new -o keys
    """
    from kdbkit.kdb.signing import write_key_pair  # loads cryptography: only for this command

    key_path, pub_path, signer = write_key_pair(output)
    key_path, pub_path = key_path.resolve(), pub_path.resolve()  # the settings must work from any folder
    settings = {"KDB_REMOTE_SIGNING_KEY": str(key_path), "KDB_REMOTE_TRUSTED_KEYS": str(pub_path)}
    if as_json:
        print_json({"key_id": signer.key_id, "private_key": str(key_path), "public_key": str(pub_path),
                    "settings": settings})
        return
    out.print(f"key id       {signer.key_id}")
    out.print(f"private key  {escape(str(key_path))}  (mode 0600: keep it on the machines that publish, only)")
    out.print(f"public key   {escape(str(pub_path))}  (copy it to every machine that reads the cluster cache)")
    out.print("On the machines that publish (builders):")
    out.print(f"  export KDB_REMOTE_SIGNING_KEY={escape(shlex.quote(str(key_path)))}")
    out.print("On every machine that reads (where the public key was copied to):")
    out.print(f"  export KDB_REMOTE_TRUSTED_KEYS={escape(shlex.quote(str(pub_path)))}")
