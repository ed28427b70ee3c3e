"""pip install --no-build-isolation .  (docs/PYTHON.md, "Installing")

Builds the extension module kiln._kiln with CMake in the build folder that `make` uses
(KILN_BUILD_DIR, default build/), so an existing build is reused, and installs the package
python/kiln with it. Debian's pip, setuptools and wheel; nothing is downloaded.
"""
import os
import re
import shutil
import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def project_version():
    """The version in CMakeLists.txt's project(): Kiln's one definition of it."""
    found = re.search(r"project\(Kiln VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text())
    if not found:
        raise RuntimeError("CMakeLists.txt has no `project(Kiln VERSION x.y.z ...)`")
    return found.group(1)


(ROOT / "build" / "setuptools").mkdir(parents=True, exist_ok=True)  # setup.cfg's egg_base


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = Path(os.environ.get("KILN_BUILD_DIR", ROOT / "build")).resolve()
        if not (build_dir / "build.ninja").exists():
            subprocess.check_call(
                [
                    "cmake",
                    "-S",
                    str(ROOT),
                    "-B",
                    str(build_dir),
                    "-G",
                    "Ninja",
                    "-DCMAKE_BUILD_TYPE=Release",
                ]
            )
        jobs = str(os.cpu_count() or 1)
        subprocess.check_call(["cmake", "--build", str(build_dir), "-j", jobs, "--target", "_kiln"])
        built = sorted((ROOT / "python" / "kiln").glob("_kiln*.so"), key=os.path.getmtime)
        if not built:
            raise RuntimeError("CMake built no python/kiln/_kiln*.so")
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built[-1], target)


setup(
    version=project_version(),
    packages=["kiln", "kiln.autograph"],
    package_dir={"": "python"},
    package_data={"kiln": ["*.pyi", "py.typed"]},
    ext_modules=[Extension("kiln._kiln", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)
