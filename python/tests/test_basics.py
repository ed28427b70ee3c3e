"""The package imports, tensors round-trip through NumPy, and errors name the Python line."""
import pathlib
import re

import numpy as np
import pytest

import kiln as kl


def test_version_is_the_projects_one_definition():
    root = pathlib.Path(__file__).resolve().parents[2]
    cmake = re.search(r"project\(Kiln VERSION ([0-9.]+)", (root / "CMakeLists.txt").read_text())
    assert kl.__version__ == cmake.group(1)
    # pip takes it from setup.py, which reads CMakeLists.txt: pyproject.toml has no copy.
    pyproject = (root / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and "\nversion =" not in pyproject


def test_asarray_shares_numpy_memory():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = kl.asarray(a)
    assert t.shape == (2, 3) and t.dtype == kl.float32
    a[1, 2] = 42.0
    assert np.asarray(t)[1, 2] == 42.0
    np.asarray(t)[0, 0] = -1.0
    assert a[0, 0] == -1.0


def test_python_scalars_and_lists():
    assert kl.asarray(3).dtype == kl.int32
    assert kl.asarray(3.5).dtype == kl.float32
    assert kl.asarray(True).dtype == kl.bool_
    np.testing.assert_array_equal(
        np.asarray(kl.asarray([[1.5, 2], [3, 4]])), np.array([[1.5, 2], [3, 4]], np.float32)
    )


def test_strided_views():
    a = np.arange(24, dtype=np.float64).reshape(4, 6)[::-2, 1::2]
    t = kl.asarray(a)
    np.testing.assert_array_equal(np.asarray(t), a)


def test_error_names_the_python_line():
    with pytest.raises(kl.Error) as info:
        kl.asarray(np.array(["a"]))
    assert "[asarray]" in str(info.value)
    assert "test_basics.py" in str(info.value)
