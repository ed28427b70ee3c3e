"""Run-time helpers of kiln.autograph: the converted code calls them as ag__.<name> (conversion
binds ag__ to this module)."""
import builtins
import os
import sysconfig
import threading
import types

from .. import _kiln
from . import conversion  # callee converts; conversion reads this module back (both by module)


class Undefined:
    """The value of a variable that Python would leave unbound (assigned on some paths only).

    A converted statement passes every variable it assigns in and out of functions, so one that
    was never bound travels as an Undefined; using it raises an error naming the variable."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"<undefined variable {self.name!r}>"

    def _fail(self, *args, **kwargs):
        raise UnboundLocalError(
            f"variable {self.name!r} is not defined here: it is assigned only "
            "on some paths of a converted if/while/for before this use"
        )

    __bool__ = __call__ = __iter__ = __len__ = __index__ = __float__ = __int__ = _fail
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = _fail
    __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __pow__ = _fail
    __matmul__ = __rmatmul__ = __neg__ = __getitem__ = __lt__ = __le__ = __gt__ = __ge__ = _fail

    def __getattr__(self, attr):
        self._fail()


def _where(loc):
    return f"{loc[0]}:{loc[1]}"


def _error(op, message, loc):
    """A kiln.Error in Kiln's style ('[op] ... (at file:line)'), naming the user's line."""
    exc = _kiln.Error(f"[{op}] {message} (at {_where(loc)})")
    exc.op = op
    return exc


def _is_traced(value):
    """Whether `value` is a kiln.Tensor of an active trace (jit, grad, vmap, ...)."""
    return isinstance(value, _kiln.Tensor) and value.is_traced


def _truth(test):
    """Python's truth of a traced scalar, as the bool scalar kiln.cond and loops take."""
    if test.dtype != _kiln.bool_ and test.ndim == 0:
        return test != 0
    return test


# Per thread: how deep kiln.jit traces are nested (`jit_depth`), and how many times each
# converted statement is being traced inside itself (`tracing`: loc -> count; only recursion
# re-enters one).
_local = threading.local()
# A function that calls itself inside its own `if`/loop on a traced tensor this many times deep
# recurses on a traced value (both branches of a kiln.cond are traced, so it would never end).
_MAX_TRACED_RECURSION = 32


class _Tracing:
    """Counts a converted statement as being traced while it traces its branches or body; one
    entered again too deep inside itself is recursion on a traced condition: a kiln.Error
    naming the function."""

    def __init__(self, loc, what):
        self.loc, self.what = loc, what

    def __enter__(self):
        tracing = _local.__dict__.setdefault("tracing", {})
        depth = tracing.get(self.loc, 0) + 1
        if depth > _MAX_TRACED_RECURSION:
            exc = _error(
                "autograph",
                f"{self.loc[2]} calls itself inside this {self.what}, whose condition is a "
                "traced tensor: got recursion "
                f"{_MAX_TRACED_RECURSION} calls deep on a traced value, expected recursion "
                "that ends on Python values (a traced condition traces every path, so the "
                f"recursion never ends): make the depth a Python value (a static argument), "
                f"or write {self.loc[2]} with kiln.while_loop / kiln.fori_loop",
                self.loc,
            )
            exc._ag_annotated = True  # the enclosing statements need not add their variables
            raise exc
        tracing[self.loc] = depth

    def __exit__(self, *exc):
        tracing = _local.tracing
        tracing[self.loc] -= 1
        if not tracing[self.loc]:
            del tracing[self.loc]


def state(frame_locals, names):
    """The values of `names` in `frame_locals` (the caller's locals()), Undefined when unbound."""
    return tuple(frame_locals[n] if n in frame_locals else Undefined(n) for n in names)


def _as_tensor_like(value, like):
    """A Python scalar result next to a Tensor carry becomes a Tensor of the carry's dtype."""
    if isinstance(value, (bool, int, float)) and isinstance(like, _kiln.Tensor):
        return _kiln.asarray(value, like.dtype)
    return value


def _as_carry(value):
    """A loop carry or branch result: Python scalars become Tensors (bool, int32, float32)."""
    if isinstance(value, (bool, int, float)):
        return _kiln.asarray(value)
    return value


def _annotate(exc, what, names, loc):
    """Adds which converted statement, and which variable each result leaf is, to an Error that
    a control-flow construct raised (the first time only: nested statements pass it on)."""
    if getattr(exc, "_ag_annotated", False):
        return exc
    leaves = ", ".join(f"[{i}] {n}" for i, n in enumerate(names)) or "none"
    new = _kiln.Error(
        f"{exc}\n  in the {what} at {_where(loc)} converted by kiln.autograph; "
        f"its variables (result leaves): {leaves}"
    )
    new.op = getattr(exc, "op", what)
    new._ag_annotated = True
    return new.with_traceback(exc.__traceback__)  # the frames that raised it, for tracebacks


def if_stmt(test, true_fn, false_fn, args, names, loc):
    """`if test:` whose branches, given the assigned variables `args`, return `names`' values.

    A traced test becomes kiln.cond (both branches traced); anything else picks one in Python."""
    if not _is_traced(test):
        return true_fn(*args) if test else false_fn(*args)
    with _Tracing(loc, "`if`"):
        return _traced_if(_truth(test), true_fn, false_fn, args, names, loc)


def _traced_if(test, true_fn, false_fn, args, names, loc):
    """if_stmt on a traced test: kiln.cond over the variables `names`."""
    if not names:  # nothing to select: trace both branches for what they check and do
        true_fn(*args)
        false_fn(*args)
        return ()
    undefined = {}

    def branch(fn, which):
        def run():
            results = fn(*args)
            undefined[which] = {n for n, v in zip(names, results) if isinstance(v, Undefined)}
            return tuple(None if isinstance(v, Undefined) else _as_carry(v) for v in results)

        return run

    def check_defined():
        if len(undefined) < 2 or undefined[True] == undefined[False]:
            return
        name = sorted(undefined[True] ^ undefined[False])[0]
        where = "false" if name in undefined[True] else "true"
        raise _error(
            "autograph",
            f"variable {name!r} is assigned only in the {where} branch of an `if` whose "
            "condition is a traced tensor, and is used after it: got it undefined on the other "
            "path, expected it defined on every path (assign it before the `if` or in both "
            "branches)",
            loc,
        )

    try:
        results = _kiln.cond(test, branch(true_fn, True), branch(false_fn, False))
    except _kiln.Error as exc:
        check_defined()
        raise _annotate(exc, "`if`", names, loc) from None
    check_defined()
    return tuple(
        Undefined(n) if n in undefined.get(True, ()) else v for n, v in zip(names, results)
    )


def if_exp(test, true_value, false_value, loc):
    """`true_value() if test else false_value()`: kiln.cond when `test` is traced."""
    if not _is_traced(test):
        return true_value() if test else false_value()
    try:
        with _Tracing(loc, "conditional expression"):
            return _kiln.cond(
                _truth(test), lambda: _as_carry(true_value()), lambda: _as_carry(false_value())
            )
    except _kiln.Error as exc:
        raise _annotate(exc, "conditional expression", ["value"], loc) from None


def _functional_carry(args, names, loc, what, targets=()):
    """The initial carry of a functional loop: every carry defined (`targets`: the loop
    variables among them), Python scalars as tensors."""
    for n, v in zip(names, args):
        if not isinstance(v, Undefined):
            continue
        if n in targets:
            raise _error(
                "autograph",
                f"the loop variable {n!r} of a {what} over a traced tensor is read after the "
                "loop but has no value before it: got it undefined on entry (the loop may run "
                "zero times), expected a value (assign it before the loop)",
                loc,
            )
        raise _error(
            "autograph",
            f"variable {n!r} is carried by a {what} whose condition is a traced tensor but "
            "is not defined before it: got it undefined on entry, expected a value "
            "(initialise it before the loop)",
            loc,
        )
    return tuple(_as_carry(v) for v in args)


def _body_results(results, init, names, loc, what):
    out = []
    for n, v, like in zip(names, results, init):
        if isinstance(v, Undefined):
            raise _error(
                "autograph",
                f"variable {n!r} is deleted in the body of a {what} whose "
                "condition is a traced tensor: got it undefined, expected a value",
                loc,
            )
        out.append(_as_tensor_like(v, like))
    return tuple(out)


def while_stmt(test_fn, body_fn, args, names, loc):
    """`while test_fn(*carry): carry = body_fn(*carry)` over the variables `names`.

    Runs as a Python loop while the test gives Python values (or concrete tensors); from the
    first test that is a traced tensor on, the rest of the loop is one kiln.while_loop."""
    while True:
        test = test_fn(*args)
        if _is_traced(test):
            break
        if not test:
            return args
        args = body_fn(*args)
    init = _functional_carry(args, names, loc, "`while` loop")
    try:
        with _Tracing(loc, "`while` loop"):
            return tuple(
                _kiln.while_loop(
                    lambda carry: _truth(test_fn(*carry)),
                    lambda carry: _body_results(body_fn(*carry), init, names, loc, "`while` loop"),
                    init,
                )
            )
    except _kiln.Error as exc:
        raise _annotate(exc, "`while` loop", names, loc) from None


def _broken(args, names, break_flag):
    """Whether a loop's `break` flag is set, as a Python bool (a traced flag: no, the guarded
    body does nothing once it is set)."""
    if break_flag is None:
        return False
    flag = args[names.index(break_flag)]
    return not _is_traced(flag) and bool(flag)


def for_range(range_fn, range_args, body_fn, args, names, targets, break_flag, loc):
    """`for i in range(*range_args): carry = body_fn(i, *carry)`.

    Bounds that are traced tensors make a kiln.fori_loop over the trip count (a step that is a
    Python int) or, for a traced step or a `break` (which stops the loop early), a
    kiln.while_loop; otherwise (or when `range` is not the builtin) Python iterates.
    `targets`: the loop variables among the carries (read after the loop). `break_flag`: the
    carry that a `break` sets (see _lower_jumps), or None."""
    if range_fn is not builtins.range or not any(_is_traced(a) for a in range_args):
        for i in range_fn(*range_args):
            args = body_fn(i, *args)
            if _broken(args, names, break_flag):
                break
        return args
    if len(range_args) == 1:
        lower, upper, step = 0, range_args[0], 1
    elif len(range_args) == 2:
        (lower, upper), step = range_args, 1
    else:
        lower, upper, step = range_args
    if isinstance(step, int) and step == 0:
        raise ValueError("range() arg 3 must not be zero")
    init = _functional_carry(args, names, loc, "`for` loop", targets)
    traced = next(a for a in range_args if _is_traced(a))
    # Python int bounds take the traced bound's integer dtype.
    lower, upper = (
        _kiln.asarray(v, traced.dtype) if isinstance(v, int) else v for v in (lower, upper)
    )
    fori = isinstance(step, int) and break_flag is None
    try:
        with _Tracing(loc, "`for` loop"):
            if fori:
                return _fori_range(lower, upper, step, body_fn, init, names, loc)
            return _while_range(lower, upper, step, body_fn, init, names, break_flag, loc)
    except _kiln.Error as exc:
        leaves = names if fori else ("<the range's index>",) + tuple(names)
        raise _annotate(exc, "`for` loop", leaves, loc) from None


def _fori_range(lower, upper, step, body_fn, init, names, loc):
    """range(lower, upper, step) with a Python int step as one kiln.fori_loop: over the bounds
    themselves for step 1, else over the trip count, with i = lower + k * step."""

    def body(i, carry):
        return _body_results(body_fn(i, *carry), init, names, loc, "`for` loop")

    if step == 1:
        return tuple(_kiln.fori_loop(lower, upper, body, init))
    span = upper - lower if step > 0 else lower - upper
    trips = _kiln.maximum((span + (abs(step) - 1)) // abs(step), 0)
    return tuple(_kiln.fori_loop(0, trips, lambda k, carry: body(lower + k * step, carry), init))


def _while_range(lower, upper, step, body_fn, init, names, break_flag, loc):
    """range(lower, upper, step) with a traced step or a `break` flag as a kiln.while_loop over
    (i, carry), which stops once the flag is set."""
    flag = None if break_flag is None else 1 + names.index(break_flag)

    def test(carry):
        i = carry[0]
        if isinstance(step, int):
            more = i < upper if step > 0 else i > upper
        else:
            more = _kiln.where(step > 0, i < upper, i > upper)
        return more if flag is None else _kiln.logical_and(more, _kiln.logical_not(carry[flag]))

    def body(carry):
        i, rest = carry[0], carry[1:]
        return (i + step,) + _body_results(body_fn(i, *rest), init, names, loc, "`for` loop")

    return tuple(_kiln.while_loop(test, body, (lower,) + init))[1:]


def for_stmt(iterable, body_fn, args, names, targets, break_flag, loc):
    """`for x in iterable: carry = body_fn(x, *carry)`. A traced tensor is scanned along its
    leading axis with kiln.scan (after a `break` the guarded body does nothing); anything else
    is iterated by Python."""
    if not _is_traced(iterable):
        for item in iterable:
            args = body_fn(item, *args)
            if _broken(args, names, break_flag):
                break
        return args
    init = _functional_carry(args, names, loc, "`for` loop", targets)

    def step(carry, x):
        return _body_results(body_fn(x, *carry), init, names, loc, "`for` loop"), None

    try:
        with _Tracing(loc, "`for` loop"):
            carry, _ = _kiln.scan(step, init, iterable)
    except _kiln.Error as exc:
        raise _annotate(exc, "`for` loop", names, loc) from None
    return tuple(carry)


def guard(test, loc, construct, reason):
    """The test of a statement that stays Python's (it contains `reason`): fine on Python values
    and concrete tensors, a clear error on a traced tensor."""
    if _is_traced(test):
        raise _error(
            "autograph",
            f"this {construct} cannot be converted to Kiln control flow ({reason}): got a "
            "condition that is a traced tensor, expected a Python value or a concrete tensor "
            "(restructure it, or use kiln.cond / kiln.while_loop directly)",
            loc,
        )
    return test


def guard_range(range_fn, range_args, loc, reason):
    """range(*range_args) for a `for` loop that stays Python's (see guard)."""
    for a in range_args:
        guard(a, loc, "`for` loop", reason)
    return range_fn(*range_args)


def and_(first, second):
    """`a and b` in a converted test: logical_and when `a` is traced, else Python's `and`."""
    a = first()
    if _is_traced(a):
        return _kiln.logical_and(a, second())
    return a and second()


def or_(first, second):
    """`a or b` in a converted test: logical_or when `a` is traced, else Python's `or`."""
    a = first()
    if _is_traced(a):
        return _kiln.logical_or(a, second())
    return a or second()


def not_(a):
    """`not a` in a converted test: logical_not when `a` is traced, else Python's `not`."""
    return _kiln.logical_not(a) if _is_traced(a) else not a


# The kiln package (this file is in kiln/autograph/): its functions are not converted.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# Where the standard library and installed packages live: their functions are not converted.
_LIBRARY_DIRS = tuple(
    sorted(
        {
            os.path.abspath(p) + os.sep
            for k in ("stdlib", "platstdlib", "purelib", "platlib")
            if (p := sysconfig.get_paths().get(k))
        }
    )
)
_user_code = {}  # code object -> whether callee converts functions with it


def _is_user_code(code):
    """Functions of the user's own files are converted when called from converted code; those of
    Kiln, the standard library and installed packages are not."""
    user = _user_code.get(code)
    if user is None:
        path = os.path.abspath(code.co_filename)
        user = _user_code[code] = not (
            code.co_filename.startswith("<")
            or path.startswith(_PACKAGE_DIR)
            or path.startswith(_LIBRARY_DIRS)
            or os.sep + "dist-packages" + os.sep in path
            or os.sep + "site-packages" + os.sep in path
        )
    return user


def callee(fun):
    """What converted code calls for `fun(...)`: the converted function when `fun` is a Python
    function, bound method or callable object (its __call__) of the user's code, else `fun`."""
    # Exact types, not isinstance: a subclass of these is not plain user code.
    kind = type(fun)
    if kind is types.FunctionType:  # noqa: E721
        return conversion.convert(fun) if _is_user_code(fun.__code__) else fun
    if (
        kind is types.MethodType  # noqa: E721
        and type(fun.__func__) is types.FunctionType  # noqa: E721
        and _is_user_code(fun.__func__.__code__)
    ):
        return conversion.convert(fun)
    call = getattr(kind, "__call__", None)  # an instance of a user class with __call__
    if type(call) is types.FunctionType and _is_user_code(call.__code__):  # noqa: E721
        return types.MethodType(conversion.convert(call), fun)
    return fun
