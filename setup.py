"""Maps the top-level folders onto one installed package `specrt`.

The design card puts export/, runtime/, engines/ and bench/ (and the models/ both export and the
runtime build on) at the top of the repository, while users import them as specrt.export,
specrt.runtime, ... . setuptools' package_dir does the mapping for normal and editable installs;
this file only lists the packages so a new subpackage needs no edit anywhere.
"""
import os

from setuptools import setup

PACKAGE_FOLDERS = {
    "specrt": "specrt",
    "specrt.models": "models",
    "specrt.export": "export",
    "specrt.runtime": "runtime",
    "specrt.engines": "engines",
    "specrt.bench": "bench",
}


def _packages() -> list[str]:
    found = []
    for package, folder in PACKAGE_FOLDERS.items():
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "__"))]
            if "__init__.py" in filenames:
                suffix = os.path.relpath(dirpath, folder)
                found.append(package if suffix == "." else package + "." + suffix.replace(os.sep, "."))
    return found


setup(packages=_packages(), package_dir=PACKAGE_FOLDERS)
