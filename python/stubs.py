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
with tempfile.TemporaryDirectory() as out:
    stubgen(["-m", "kiln._kiln", "-o", out, "--quiet"])
    text = (Path(out) / "kiln" / "_kiln.pyi").read_text()
# pybind11 names a parameter taking any Python object by its C++ type, py::handle.
text = re.sub(r"\bhandle\b", "object", text)
target = root / "kiln" / "_kiln.pyi"
tmp = target.with_suffix(".pyi.tmp")
tmp.write_text(text)
os.replace(tmp, target)
