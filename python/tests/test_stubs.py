"""The generated type stubs cover the module's public API, and what is public is documented."""
import ast
import inspect
import pathlib

import kiln
import kiln._kiln as native


def public_names(module):
    return {n for n in dir(module) if not n.startswith("_")}


def test_stubs_parse_and_name_every_public_object():
    stub = pathlib.Path(native.__file__).with_name("_kiln.pyi")
    tree = ast.parse(stub.read_text())
    named = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            named.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            named.add(node.target.id)
        elif isinstance(node, ast.Assign):
            named.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            named.update((a.asname or a.name).split(".")[0] for a in node.names)
    missing = public_names(native) - named
    assert not missing, f"not in _kiln.pyi: {sorted(missing)}"


def test_public_functions_and_classes_have_docstrings():
    undocumented = []
    for name in sorted(public_names(kiln)):
        obj = getattr(kiln, name)
        if inspect.ismodule(obj) or not callable(obj) or isinstance(obj, native.dtype):
            continue
        doc = inspect.getdoc(obj) or ""
        # pybind11 puts the signature on the first line; a docstring is more than that.
        text = "\n".join(doc.splitlines()[1:]).strip() if doc.startswith(name + "(") else doc
        if not text:
            undocumented.append(name)
    assert not undocumented, f"no docstring: {undocumented}"
