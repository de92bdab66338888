"""setuptools' package list, found rather than listed: each folder pyproject.toml maps below
``kdbkit`` ([tool.setuptools.package-dir]) with every package folder inside it, so that a new
package (a primitive, say) needs no entry anywhere. Everything else is in pyproject.toml."""

import tomllib
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent


def mapped_packages() -> list[str]:
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    mapped = {Path(folder) for folder in folders.values()}
    packages = []
    for name, folder in folders.items():
        packages.append(name)
        for sub in find_packages(str(ROOT / folder)):
            if Path(folder, *sub.split(".")) not in mapped:  # runtime/_kdbkit is kdbkit itself
                packages.append(f"{name}.{sub}")
    return sorted(packages)


setup(packages=mapped_packages())
