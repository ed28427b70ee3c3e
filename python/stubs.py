"""Writes kiln/_kiln.pyi, the type stubs of the native module, with mypy's stubgen (Debian's
python3-mypy) from the signatures and docstrings pybind11 gives it. CMake runs this after each
build of kiln._kiln, so the stubs always describe the module that was built.

usage: stubs.py PACKAGE_DIR   (the folder holding kiln/, e.g. python/)
"""
import os
import re
import sys
import tempfile
from pathlib import Path

from mypy.stubgen import main as stubgen

root = Path(sys.argv[1]).resolve()
sys.path.insert(0, str(root))
# Native submodules (kiln.fft, kiln.linalg, kiln.random: kiln/__init__.py registers them under those
# names) get stubs of their own, which _kiln.pyi imports.
SUBMODULES = ["fft", "linalg", "random"]
stubs = {}
with tempfile.TemporaryDirectory() as out:
    modules = ["kiln._kiln"] + [f"kiln.{name}" for name in SUBMODULES]
    stubgen([arg for m in modules for arg in ("-m", m)] + ["-o", out, "--quiet"])
    for name in ["_kiln"] + SUBMODULES:
        stubs[name] = (Path(out) / "kiln" / f"{name}.pyi").read_text()
stubs["_kiln"] += "".join(f"from kiln import {n} as {n}\n" for n in SUBMODULES)
for name, text in stubs.items():
    # pybind11 names a parameter taking any Python object by its C++ type, py::handle.
    text = re.sub(r"\bhandle\b", "object", text)
    target = root / "kiln" / f"{name}.pyi"
    tmp = target.with_suffix(".pyi.tmp")
    tmp.write_text(text)
    os.replace(tmp, target)
