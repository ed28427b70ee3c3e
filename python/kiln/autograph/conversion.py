"""Converting a function for kiln.autograph: find its source, rewrite it, compile it with the
function's own globals and closure cells (and ag__ bound to runtime.py); and kiln.jit, which
converts before it compiles."""
import ast
import copy
import functools
import linecache
import types
import weakref

from .. import _kiln
from . import runtime
from .analysis import _name
from .rewrite import _Converter


class _Conversion:
    """The rewritten code of one code object, and its source for to_source."""

    def __init__(self, code, source):
        self.code = code
        self.source = source


_conversions = {}  # (code object, recursive) -> _Conversion, or why it cannot be converted
_converted = weakref.WeakKeyDictionary()  # function -> {recursive: converted function}
_converted_codes = set()  # the code objects conversion made, the functions inside them too
_no_source = "no source"
_lambda_reason = f"{_no_source}: a lambda has no statements to convert"


_parsed = {}  # file name -> (its source, its ast.Module): one parse per file


def _find_def(fun):
    """A copy of the FunctionDef of `fun` in its file's source, or a string saying why there is
    none."""
    code = fun.__code__
    source = "".join(linecache.getlines(code.co_filename, fun.__globals__))
    if not source:
        return f"{_no_source}: {code.co_filename!r} is not a file linecache can read"
    cached = _parsed.get(code.co_filename)
    if cached is None or cached[0] != source:
        try:
            cached = _parsed[code.co_filename] = (source, ast.parse(source, code.co_filename))
        except SyntaxError as exc:
            return f"{_no_source}: {code.co_filename} does not parse ({exc.msg})"
    for node in ast.walk(cached[1]):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == code.co_name:
            first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            a = node.args
            params = [
                p.arg
                for p in a.posonlyargs
                + a.args
                + a.kwonlyargs
                + [v for v in (a.vararg, a.kwarg) if v]
            ]
            nparams = (
                code.co_argcount
                + code.co_kwonlyargcount
                + bool(code.co_flags & 0x04)
                + bool(code.co_flags & 0x08)
            )  # *args, **kwargs
            if code.co_firstlineno in (first, node.lineno) and params == list(
                code.co_varnames[:nparams]
            ):
                return copy.deepcopy(node)  # the rewrite changes it in place
    return (
        f"{_no_source}: no `def {code.co_name}` at {code.co_filename}:{code.co_firstlineno} "
        "(a lambda, or a file changed since it was imported)"
    )


def _rewrite(fun, recursive):
    """The converted FunctionDef of `fun` (decorators dropped: `fun` is the undecorated function)
    and the module that builds it, or a string saying why it cannot be converted."""
    if fun.__code__.co_name == "<lambda>":
        return _lambda_reason
    node = _find_def(fun)
    if isinstance(node, str):
        return node
    node.decorator_list = []
    node = _Converter(fun.__code__.co_filename, recursive).visit(node)
    ast.fix_missing_locations(node)
    # def ag__factory(ag__, <free variables>): <converted def>; so that the converted code's
    # free variables are the original's, and the original closure cells can be reused.
    freevars = list(fun.__code__.co_freevars)
    # The def binds its name in the factory; a function that calls itself by a global name
    # must still find the global there (the factory never runs, so nothing is assigned).
    own_name = [] if node.name in freevars else [ast.Global(names=[node.name])]
    factory = ast.FunctionDef(
        name="ag__factory",
        args=ast.arguments(
            posonlyargs=[],
            args=[ast.arg(arg=a) for a in ["ag__"] + freevars],
            vararg=None,
            kwonlyargs=[],
            kw_defaults=[],
            kwarg=None,
            defaults=[],
        ),
        body=own_name + [node, ast.Return(value=_name(node.name))],
        decorator_list=[],
        returns=None,
        type_comment=None,
    )
    module = ast.Module(body=[factory], type_ignores=[])
    ast.copy_location(factory, node)
    ast.fix_missing_locations(module)
    return node, module


def _conversion(fun, recursive):
    key = (fun.__code__, recursive)
    if key not in _conversions:
        try:
            rewritten = _rewrite(fun, recursive)
            if not isinstance(rewritten, str):
                node, module = rewritten
                factory = compile(module, fun.__code__.co_filename, "exec")
        except Exception as exc:  # noqa: BLE001 (a construct the rewrite gets wrong: no rewrite)
            rewritten = f"the rewrite failed ({type(exc).__name__}: {exc})"
        if isinstance(rewritten, str):
            _conversions[key] = rewritten
        else:
            factory_code = next(c for c in factory.co_consts if isinstance(c, types.CodeType))
            new_code = next(
                c
                for c in factory_code.co_consts
                if isinstance(c, types.CodeType) and c.co_name == key[0].co_name
            )
            nested = [new_code]
            while nested:  # the generated functions and nested defs (lambdas stay as written)
                code = nested.pop()
                _converted_codes.add(code)
                nested.extend(
                    c
                    for c in code.co_consts
                    if isinstance(c, types.CodeType) and c.co_name != "<lambda>"
                )
            _conversions[key] = _Conversion(new_code, ast.unparse(node))
    return _conversions[key]


def _cell(value):
    return (lambda: value).__closure__[0]


def convert(fun, recursive=True):
    """`fun` with its `if`, `while` and `for` statements rewritten to work on traced tensors.

    Usable on its own (eagerly, under grad, vmap or jit) and as a decorator. With `recursive`,
    the functions of the user's own code that `fun` calls are converted too when called (not
    those of Kiln, the standard library or installed packages). The conversion is made once
    per function and cached. What cannot be converted is returned unchanged: objects that are
    not Python functions (builtins, functools.partial, callable objects), lambdas, and
    functions whose source Python cannot find (typed at the interactive prompt, made by exec);
    their control flow stays Python's. Bound methods are converted through their function."""
    if isinstance(fun, types.MethodType):
        return types.MethodType(convert(fun.__func__, recursive), fun.__self__)
    if (
        not isinstance(fun, types.FunctionType)
        or fun.__code__ in _converted_codes
        or "ag__" in fun.__code__.co_freevars
    ):
        return fun  # not a function, or one conversion made (or a function defined inside it)
    cached = _converted.get(fun)
    if cached is not None and recursive in cached:
        return cached[recursive]
    conversion = _conversion(fun, recursive)
    if isinstance(conversion, str):
        return fun  # not cached here (a value holding its weak key would keep it alive)
    cells = dict(zip(fun.__code__.co_freevars, fun.__closure__ or ()))
    closure = tuple(
        _cell(runtime) if name == "ag__" else cells[name] for name in conversion.code.co_freevars
    )
    new = types.FunctionType(
        conversion.code, fun.__globals__, fun.__name__, fun.__defaults__, closure
    )
    new.__kwdefaults__ = fun.__kwdefaults__
    functools.update_wrapper(new, fun)
    del new.__wrapped__  # inspect should see the converted function's own code
    _converted.setdefault(fun, {})[recursive] = new
    return new


def to_source(fun, recursive=True):
    """The converted source of `fun` (a function, or what kiln.jit made of one) as a string:
    what `convert` and `jit` run. A kiln.Error when `fun` cannot be converted, saying why."""
    target = fun
    while not isinstance(target, types.FunctionType) and hasattr(target, "__wrapped__"):
        target = target.__wrapped__  # a jitted function: the function it compiles
    target = target.__func__ if isinstance(target, types.MethodType) else target
    if not isinstance(target, types.FunctionType):
        raise _kiln.Error(
            f"[autograph] to_source needs a Python function: got "
            f"{type(fun).__name__}, expected a def"
        )
    conversion = _conversion(target, recursive)
    if isinstance(conversion, str):
        raise _kiln.Error(
            f"[autograph] {target.__qualname__} cannot be converted: " f"{conversion}"
        )
    return conversion.source


def _entry(fun):
    """What the transformations (grad, vjp, jvp, jacfwd, jacrev, hessian, vmap, checkpoint) and
    the control-flow constructs (cond, switch, while_loop, fori_loop, scan) call for `fun`
    (their hook in kiln._kiln): while kiln.jit traces, `fun` converted as the calls of converted
    code are (see callee), so that `jit(grad(f))` converts f as `jit(f)` does; otherwise
    `fun`."""
    return runtime.callee(fun) if getattr(runtime._local, "jit_depth", 0) else fun


_kiln._set_autograph_entry(_entry)


def _unconverted_frames(tb):
    """(code, why) for the frames of the traceback `tb` that run the user's code unconverted,
    outermost first; `why`: the reason conversion gave, or None when it was never asked (the
    function was called from unconverted code)."""
    out = []
    while tb is not None:
        code = tb.tb_frame.f_code
        if code not in _converted_codes and runtime._is_user_code(code):
            why = (
                _lambda_reason
                if code.co_name == "<lambda>"
                else _conversions.get((code, True), _conversions.get((code, False)))
            )
            out.append((code, why if isinstance(why, str) else None))
        tb = tb.tb_next
    return out


def _concrete_value_hint(exc):
    """`exc` with a note naming the unconverted functions it was raised in, when it is Kiln's
    error for a Python statement that needs a traced tensor's value (`if x > 0` unconverted)."""
    if getattr(exc, "_ag_hinted", False) or "needs a concrete value" not in str(exc):
        return exc  # (hinted already by a jit nested in this one)
    frames = _unconverted_frames(exc.__traceback__)
    if not frames:
        return exc
    functions = ", ".join(
        f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno}: "
        f"{why or 'called from code that was not converted'})"
        for code, why in frames
    )
    new = _kiln.Error(
        f"{exc}\n  kiln.jit converts Python if/while/for on traced tensors, but this statement "
        f"runs in code it did not convert: {functions}. Convert such a function with "
        "kiln.autograph.convert (kiln.autograph.to_source says why one cannot be: a lambda has "
        "no statements, so neither it nor what it calls is converted), or write its control "
        "flow with kiln.cond / kiln.while_loop / kiln.fori_loop"
    )
    new.op = getattr(exc, "op", "autograph")
    new._ag_hinted = True
    return new


def _jit_tracing(fun):
    """What jit traces for `fun`: `fun` converted, run as a jit trace for _entry, with the hint
    of _concrete_value_hint on its errors."""

    @functools.wraps(fun)
    def traced(*args, **kwargs):
        depth = getattr(runtime._local, "jit_depth", 0)
        runtime._local.jit_depth = depth + 1
        try:
            return convert(fun)(*args, **kwargs)  # cached after the first trace
        except _kiln.Error as exc:
            hinted = _concrete_value_hint(exc)
            if hinted is exc:
                raise
            raise hinted.with_traceback(exc.__traceback__) from None
        finally:
            runtime._local.jit_depth = depth

    return traced


def jit(fun=None, *, static_argnums=(), static_argnames=(), autograph=True, **options):
    """kiln.jit with Python control flow: `fun` is converted (see kiln.autograph.convert) unless
    `autograph=False`, and so is every function of the user's code that a transformation
    (grad, vmap, ...) or a control-flow construct (cond, scan, ...) calls while it is traced
    (`jit(grad(f))` converts f);
    then it is compiled by the native jit (traced once per signature, then run without calling
    back into Python). static_argnums / static_argnames: the arguments held static (hashable,
    passed to `fun` by value, one trace per value), by position or keyword name; `fun`'s
    signature maps one onto the other, as in JAX. Usable as @kiln.jit and
    @kiln.jit(static_argnums=..., static_argnames=...)."""
    if fun is None:
        return functools.partial(
            jit,
            static_argnums=static_argnums,
            static_argnames=static_argnames,
            autograph=autograph,
            **options,
        )
    traced = _jit_tracing(fun) if autograph else fun
    jitted = _kiln.jit(
        traced, static_argnums=static_argnums, static_argnames=static_argnames, **options
    )
    try:
        jitted.__wrapped__ = fun  # for to_source and inspect
    except (AttributeError, TypeError):
        pass
    return jitted
