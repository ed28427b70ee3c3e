"""Writes reference values for the C++ tests as a safetensors file, atomically.

A reference script (tests/reference/<name>_ref.py) computes its values with numpy / scipy and
ends with `write(sys.argv[1], {"case/name": array, ...})`; tests/CMakeLists.txt runs it at build
time (`kiln_reference_file`) and the test reads the file with `testing::reference(name)`
(tests/testing.h). Arrays keep their dtype (float32/64, int32/64, uint8, bool).
"""
import json
import os
import tempfile

import numpy as np

_DTYPES = {
    np.dtype(np.float64): "F64",
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(np.int64): "I64",
    np.dtype(np.int32): "I32",
    np.dtype(np.int16): "I16",
    np.dtype(np.int8): "I8",
    np.dtype(np.uint8): "U8",
    np.dtype(np.bool_): "BOOL",
}


def write(path, arrays):
    header, blobs, offset = {}, [], 0
    for name in sorted(arrays):
        # ascontiguousarray makes 0-d arrays 1-d (numpy < 2); the reshape keeps them 0-d.
        a = np.ascontiguousarray(arrays[name]).reshape(np.shape(arrays[name]))
        if a.dtype not in _DTYPES:
            raise TypeError(f"{name}: dtype {a.dtype} has no safetensors name here")
        data = a.tobytes()
        header[name] = {
            "dtype": _DTYPES[a.dtype],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)))
    with os.fdopen(fd, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)
