"""Control flow from native Python under `kiln.jit` (docs/PYTHON.md, "Python control flow under
jit (autograph)").

`convert(f)` rewrites the `if`, `while` and `for` statements of `f`'s source (Python's `ast`, as
TensorFlow's AutoGraph and MindSpore's graph mode do) into calls of the run-time helpers below.
A helper looks at its condition when it runs: a traced kiln.Tensor builds `kiln.cond`,
`kiln.while_loop`, `kiln.fori_loop` or `kiln.scan` over the variables the statement assigns;
anything else runs Python's own statement, so code on Python values behaves as before. Before
that, `return`s inside `if`s become one assignment per path and `break`/`continue` become flag
variables, so those statements convert too; calls go through `callee`, which converts the
user's functions when they are called. `to_source(f)` shows the rewritten source; `jit`
converts, then calls the native `jit`.

How a statement becomes functions (`n` and `steps` assigned in the loop and live after it; the
functions are named after the statement's line):

    while n != 1:                   def ag__while_test_2(n, steps):
        n = n // 2                      return n != 1
        steps += 1                  def ag__while_body_2(n, steps):
                                        n = n // 2
                                        steps += 1
                                        return (n, steps)
                                    (n, steps) = ag__.while_stmt(ag__while_test_2,
                                        ag__while_body_2, ag__.state(locals(), ('n', 'steps')),
                                        ('n', 'steps'), ('file.py', 2, 'f'))
"""
import ast
import builtins
import copy
import functools
import linecache
import os
import sys
import sysconfig
import threading
import types
import weakref

from . import _kiln

__all__ = ["convert", "to_source", "jit", "Undefined"]

# ---------------------------------------------------------------------------------------------
# Run-time helpers: the converted code calls them as ag__.<name>.
# ---------------------------------------------------------------------------------------------


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


_FRAME_BUILTINS = {"super", "locals", "globals", "vars", "dir", "eval", "exec"}
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
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
        return convert(fun) if _is_user_code(fun.__code__) else fun
    if (
        kind is types.MethodType  # noqa: E721
        and type(fun.__func__) is types.FunctionType  # noqa: E721
        and _is_user_code(fun.__func__.__code__)
    ):
        return convert(fun)
    call = getattr(kind, "__call__", None)  # an instance of a user class with __call__
    if type(call) is types.FunctionType and _is_user_code(call.__code__):  # noqa: E721
        return types.MethodType(convert(call), fun)
    return fun


# ---------------------------------------------------------------------------------------------
# Analysis: which names a statement assigns, and which are live (read before being reassigned)
# after it.
# ---------------------------------------------------------------------------------------------

_SCOPES = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.Lambda,
    ast.ClassDef,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
)


def _walk_scope(node, enter=True):
    """The nodes of `node` that run in its scope: not inside nested functions, classes or
    comprehensions (their names, defaults and decorators do run here); `enter`: `node` itself
    is the scope (a function's body), not a nested one."""
    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        if (n is not node or not enter) and isinstance(n, _SCOPES):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                todo.extend(n.decorator_list)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                todo.extend(n.args.defaults + [d for d in n.args.kw_defaults if d])
            if isinstance(n, ast.ClassDef):
                todo.extend(n.bases + [k.value for k in n.keywords])
            if isinstance(n, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
                todo.append(n.generators[0].iter)
            continue
        todo.extend(ast.iter_child_nodes(n))


def _assigned(nodes):
    """Names the statements `nodes` bind in the current scope."""
    out = set()
    for node in nodes:
        for n in _walk_scope(node, enter=False):
            if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
                out.add(n.id)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(n.name)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                out.update((a.asname or a.name).split(".")[0] for a in n.names)
            elif isinstance(n, ast.ExceptHandler) and n.name:
                out.add(n.name)
            elif isinstance(n, (ast.MatchAs, ast.MatchStar)) and n.name:
                out.add(n.name)
            elif isinstance(n, ast.MatchMapping) and n.rest:
                out.add(n.rest)
    return out


def _reads(node):
    """Every name `node` reads, nested functions included (they may run at any later time)."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            out.add(n.id)
        elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
            out.add(n.target.id)  # `k += 1` reads k
    return out


def _closures(fn):
    """The functions and lambdas of `fn`'s scope bound to names (`def g` or `g = lambda ...`):
    name -> the names of `fn`'s scope they read (transitively, through each other). Reading
    such a name reads those names too: the function may be called at any later time."""
    out = {}
    for s in fn.body:
        for n in _walk_scope(s, enter=False):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                bound = [(n.name, n)]
            elif isinstance(n, ast.Assign) and isinstance(n.value, ast.Lambda):
                bound = [(t.id, n.value) for t in n.targets if isinstance(t, ast.Name)]
            else:
                continue
            for name, f in bound:
                a = f.args
                own = {
                    p.arg
                    for p in a.posonlyargs
                    + a.args
                    + a.kwonlyargs
                    + [v for v in (a.vararg, a.kwarg) if v]
                }
                if not isinstance(f, ast.Lambda):
                    own |= _assigned(f.body)
                out[name] = out.get(name, set()) | (_reads(f) - own)
    changed = True
    while changed:  # one closure calling another reads what that one reads
        changed = False
        for name, reads in out.items():
            more = set().union(*(out[r] for r in reads & out.keys())) - reads
            if more:
                reads |= more
                changed = True
    return out


class _Liveness:
    """Backward liveness over one function body. Records, for each statement, the names live
    after it (`after`), and for each loop what is live at its test (`header`). `closures` (see
    _closures): reading one of its names reads what that function reads."""

    def __init__(self, closures):
        self.after = {}
        self.header = {}
        self.closures = closures
        self.loops = []  # (live after the loop, live at its header) of enclosing loops

    def reads(self, node):
        out = _reads(node)
        return out.union(*(self.closures[n] for n in out & self.closures.keys()))

    def block(self, stmts, live):
        for s in reversed(stmts):
            live = self.stmt(s, live)
        return live

    def stmt(self, s, live):
        self.after[s] = frozenset(live)
        if isinstance(s, ast.If):
            return self.reads(s.test) | self.block(s.body, live) | self.block(s.orelse, live)
        if isinstance(s, (ast.While, ast.For, ast.AsyncFor)):
            return self.loop(s, live)
        if isinstance(s, ast.Break):
            return set(self.loops[-1][0]) if self.loops else set(live)
        if isinstance(s, ast.Continue):
            return set(self.loops[-1][1]) if self.loops else set(live)
        if isinstance(s, (ast.Return, ast.Raise)):
            return set().union(*(self.reads(c) for c in ast.iter_child_nodes(s)))
        if isinstance(s, (ast.With, ast.AsyncWith)):
            inner = self.block(s.body, live) - _assigned(
                [i.optional_vars for i in s.items if i.optional_vars]
            )
            return inner | set().union(*(self.reads(i.context_expr) for i in s.items))
        if isinstance(s, (ast.Try, ast.TryStar)):
            final = self.block(s.finalbody, live)
            after_body = self.block(s.orelse, final)
            handlers = set()
            for h in s.handlers:
                handlers |= self.block(h.body, final) - ({h.name} if h.name else set())
                handlers |= self.reads(h.type) if h.type else set()
            # Any statement of the body may raise: what the handlers read is live throughout.
            return self.block(s.body, after_body | handlers) | handlers | final
        if isinstance(s, ast.Match):
            out = self.reads(s.subject)
            for case in s.cases:
                out |= (self.block(case.body, live) - _assigned([case.pattern])) | self.reads(
                    case.pattern
                )
                out |= self.reads(case.guard) if case.guard else set()
            return out
        # A simple statement, a nested function or class: kill what it binds, add what it reads.
        return (set(live) - _assigned([s])) | self.reads(s)

    def loop(self, s, live):
        exit_live = self.block(s.orelse, live)
        header = set(exit_live)
        while True:  # the header's set only grows; a fixpoint comes in a few rounds
            self.loops.append((frozenset(live), frozenset(header)))
            body = self.block(s.body, header)
            self.loops.pop()
            if isinstance(s, ast.While):
                new = header | body | self.reads(s.test)
            else:
                new = header | (body - _assigned([s.target])) | self.reads(s.target)
            if new == header:
                break
            header = new
        self.header[s] = frozenset(header)
        return header | (self.reads(s.iter) if not isinstance(s, ast.While) else set())


def _escapes(stmts, loop_level):
    """The first `return`/`yield`/`await` in `stmts`, or `break`/`continue` leaving the statement
    (loop_level: inside how many loops of the statement we are); None when there is none."""
    for s in stmts:
        for n in _walk_scope(s, enter=False):
            if isinstance(n, (ast.Return, ast.Yield, ast.YieldFrom, ast.Await)):
                return n
        if isinstance(s, (ast.Break, ast.Continue)) and loop_level == 0:
            return s
        if isinstance(s, (ast.While, ast.For, ast.AsyncFor)):
            found = _escapes(s.body, loop_level + 1) or _escapes(s.orelse, loop_level)
        elif isinstance(s, _SCOPES):
            found = None
        else:
            found = None
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(s, field, ()):
                    inner = (
                        child.body
                        if isinstance(child, (ast.ExceptHandler, ast.match_case))
                        else [child]
                    )
                    found = found or _escapes(inner, loop_level)
        if found:
            return found
    return None


_ESCAPE_NAMES = {
    ast.Return: "return",
    ast.Yield: "yield",
    ast.YieldFrom: "yield from",
    ast.Await: "await",
    ast.Break: "break",
    ast.Continue: "continue",
}


def _has_return(stmts):
    return any(isinstance(n, ast.Return) for s in stmts for n in _walk_scope(s, enter=False))


def _returns_only_through_ifs(stmts):
    """Every `return` in `stmts` is reached through `if` statements only (no loop, with, try)."""
    for s in stmts:
        if isinstance(s, ast.If):
            if not _returns_only_through_ifs(s.body) or not _returns_only_through_ifs(s.orelse):
                return False
        elif not isinstance(s, ast.Return) and _has_return([s]):
            return False
    return True


def _always_returns(stmts):
    if not stmts:
        return False
    last = stmts[-1]
    if isinstance(last, (ast.Return, ast.Raise)):
        return True
    return isinstance(last, ast.If) and _always_returns(last.body) and _always_returns(last.orelse)


def _lift_returns(stmts):
    """Moves the statements after an `if` that returns on some of its paths into the branches
    that fall through, so that the `if` ends its block and every path through it returns:
    `if c: return a` + `rest` -> `if c: return a` / `else: rest`."""
    for i, s in enumerate(stmts):
        if isinstance(s, ast.Return):
            return stmts[: i + 1]
        if isinstance(s, ast.If) and _has_return([s]) and _returns_only_through_ifs([s]):
            rest = stmts[i + 1 :]
            for branch in ("body", "orelse"):
                block = getattr(s, branch)
                if not _always_returns(block):
                    block = block + copy.deepcopy(rest)
                setattr(s, branch, _lift_returns(block))
            return stmts[:i] + [s]
    return stmts


def _returns_to_assignments(stmts):
    """`return v` -> `ag__return = v` through the `if`s of stmts (see _lift_returns)."""
    for i, s in enumerate(stmts):
        if isinstance(s, ast.Return):
            stmts[i] = ast.copy_location(
                ast.Assign(
                    targets=[_name("ag__return", store=True)], value=s.value or ast.Constant(None)
                ),
                s,
            )
        elif isinstance(s, ast.If):
            _returns_to_assignments(s.body)
            _returns_to_assignments(s.orelse)


def _convert_returns(fn):
    """A function whose `return`s sit in `if` statements (outside loops) returns once, at the
    end, a variable the branches assign; so those `if`s can become kiln.cond."""
    if any(
        isinstance(n, (ast.Yield, ast.YieldFrom))
        for s in fn.body
        for n in _walk_scope(s, enter=False)
    ):
        return
    body = (
        fn.body
        if _always_returns(fn.body)
        else fn.body + [ast.copy_location(ast.Return(value=None), fn.body[-1])]
    )
    body = _lift_returns(body)
    last = body[-1]
    if isinstance(last, ast.If) and _has_return([last]) and _returns_only_through_ifs([last]):
        _returns_to_assignments([last])
        body.append(ast.copy_location(ast.Return(value=_name("ag__return")), last))
        fn.body = body


def _jumps(stmts):
    """The kinds (ast.Break, ast.Continue) that `stmts` can take out of their loop: through
    if/with/try/match, not through nested loops or functions."""
    found = set()
    for s in stmts:
        if isinstance(s, (ast.Break, ast.Continue)):
            found.add(type(s))
        elif not isinstance(s, (ast.While, ast.For, ast.AsyncFor) + _SCOPES):
            for block in _blocks(s):
                found |= _jumps(block)
    return found


def _blocks(s):
    """The statement lists directly inside the statement `s`."""
    out = [getattr(s, f) for f in ("body", "orelse", "finalbody") if hasattr(s, f)]
    out += [h.body for h in getattr(s, "handlers", ())]
    out += [c.body for c in getattr(s, "cases", ())]
    return out


def _set_blocks(s, fn):
    for f in ("body", "orelse", "finalbody"):
        if hasattr(s, f):
            setattr(s, f, fn(getattr(s, f)))
    for h in getattr(s, "handlers", ()):
        h.body = fn(h.body)
    for c in getattr(s, "cases", ()):
        c.body = fn(c.body)


def _flag_test(kinds, flags):
    """`not flag` (or `not b and not c`) for the flags of the jump kinds in `kinds`."""
    tests = [
        ast.UnaryOp(op=ast.Not(), operand=_name(flags[k]))
        for k in (ast.Break, ast.Continue)
        if k in kinds
    ]
    return tests[0] if len(tests) == 1 else ast.BoolOp(op=ast.And(), values=tests)


def _guard_jumps(stmts, flags):
    """`break`/`continue` -> `flag = True`, and what follows a statement that may set a flag
    runs under `if not flag:`."""
    out = []
    for i, s in enumerate(stmts):
        if isinstance(s, (ast.Break, ast.Continue)):
            out.append(
                ast.copy_location(
                    ast.Assign(
                        targets=[_name(flags[type(s)], store=True)], value=ast.Constant(True)
                    ),
                    s,
                )
            )
            return out
        kinds = _jumps([s])
        if not kinds:
            out.append(s)
            continue
        _set_blocks(s, lambda block: _guard_jumps(block, flags))
        out.append(s)
        if stmts[i + 1 :]:
            out.append(
                ast.copy_location(
                    ast.If(
                        test=_flag_test(kinds, flags),
                        body=_guard_jumps(stmts[i + 1 :], flags),
                        orelse=[],
                    ),
                    stmts[i + 1],
                )
            )
        return out
    return out


def _lower_jumps(stmts):
    """Rewrites the loops of `stmts` (innermost first) whose `break`/`continue` can become
    flags: `break` sets ag__break_<line>, which the loop's test (a `while`) or its helper (a
    `for`) checks and which guards the body and the `else` clause; `continue` sets
    ag__continue_<line>, reset at the top of each iteration. The flags are ordinary variables,
    so a traced condition makes them bool tensors carried by the loop. Loops that also
    `return` or `yield` keep their jumps (they stay Python's)."""
    out = []
    for s in stmts:
        if isinstance(s, _SCOPES):
            out.append(s)
            continue
        _set_blocks(s, _lower_jumps)
        kinds = _jumps(s.body) if isinstance(s, (ast.While, ast.For)) else set()
        if not kinds or _escapes(s.body, 1) is not None:
            out.append(s)
            continue
        flags = {ast.Break: f"ag__break_{s.lineno}", ast.Continue: f"ag__continue_{s.lineno}"}
        body = _guard_jumps(s.body, flags)
        if ast.Continue in kinds:
            body.insert(
                0,
                ast.copy_location(
                    ast.Assign(
                        targets=[_name(flags[ast.Continue], store=True)], value=ast.Constant(False)
                    ),
                    s.body[0],
                ),
            )
        if ast.Break in kinds:
            out.append(
                ast.copy_location(
                    ast.Assign(
                        targets=[_name(flags[ast.Break], store=True)], value=ast.Constant(False)
                    ),
                    s,
                )
            )
            not_broken = _flag_test({ast.Break}, flags)
            if isinstance(s, ast.While):
                s.test = ast.copy_location(
                    ast.BoolOp(op=ast.And(), values=[not_broken, s.test]), s.test
                )
            else:  # the whole body, so that a scan or an unrolled loop does nothing once broken
                body = [ast.copy_location(ast.If(test=not_broken, body=body, orelse=[]), s)]
                s.ag_break = flags[ast.Break]
            if s.orelse:
                s.orelse = [
                    ast.copy_location(
                        ast.If(test=copy.deepcopy(not_broken), body=s.orelse, orelse=[]),
                        s.orelse[0],
                    )
                ]
        s.body = body
        out.append(s)
    return out


# ---------------------------------------------------------------------------------------------
# The rewrite.
# ---------------------------------------------------------------------------------------------


def _name(id_, store=False):
    return ast.Name(id=id_, ctx=ast.Store() if store else ast.Load())


def _tuple(names, store=False):
    return ast.Tuple(
        elts=[_name(n, store) for n in names], ctx=ast.Store() if store else ast.Load()
    )


def _strings(names):
    return ast.Tuple(elts=[ast.Constant(n) for n in names], ctx=ast.Load())


def _call(helper, *args):
    return ast.Call(
        func=ast.Attribute(value=_name("ag__"), attr=helper, ctx=ast.Load()),
        args=list(args),
        keywords=[],
    )


def _lambda(expr):
    return ast.Lambda(
        args=ast.arguments(
            posonlyargs=[],
            args=[],
            vararg=None,
            kwonlyargs=[],
            kw_defaults=[],
            kwarg=None,
            defaults=[],
        ),
        body=expr,
    )


class _Converter(ast.NodeTransformer):
    """Rewrites the statements of one function (and of the functions defined inside it)."""

    def __init__(self, filename, recursive):
        self.filename = filename
        self.recursive = recursive
        self.liveness = []  # one per enclosing function
        self.names = set()  # the functions made so far
        self.globals = []  # names declared global, per enclosing function
        self.declared = []  # names declared global or nonlocal, per enclosing function
        self.functions = []  # the enclosing functions' names, innermost last

    # -- scopes --

    def visit_FunctionDef(self, node):
        _convert_returns(node)
        node.body = _lower_jumps(node.body)
        live = _Liveness(_closures(node))
        live.block(node.body, set())
        self.liveness.append(live)
        self.globals.append(
            {n for s in _walk_scope(node) if isinstance(s, ast.Global) for n in s.names}
        )
        self.declared.append(
            self.globals[-1]
            | {n for s in _walk_scope(node) if isinstance(s, ast.Nonlocal) for n in s.names}
        )
        self.functions.append(node.name)
        self.generic_visit(node)
        self.liveness.pop()
        self.globals.pop()
        self.declared.pop()
        self.functions.pop()
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        return node  # a class body runs once, at definition: its statements stay Python's

    def visit_Lambda(self, node):
        return node  # a lambda's body is an expression; its `x if c else y` stays Python's

    def visit_Call(self, node):
        """f(...) -> ag__.callee(f)(...): a user function called from converted code is
        converted too (when `recursive`). Calls that look at their caller's frame stay as they
        are."""
        self.generic_visit(node)
        if self.recursive and not (
            isinstance(node.func, ast.Name) and node.func.id in _FRAME_BUILTINS
        ):
            node.func = ast.copy_location(_call("callee", node.func), node.func)
        return node

    def visit_IfExp(self, node):
        self.generic_visit(node)
        return ast.copy_location(
            _call(
                "if_exp",
                self._test(node.test),
                _lambda(node.body),
                _lambda(node.orelse),
                self._loc(node),
            ),
            node,
        )

    # -- helpers --

    def _loc(self, node):
        """(file, line, function): where a helper's errors point."""
        return ast.Tuple(
            elts=[
                ast.Constant(self.filename),
                ast.Constant(node.lineno),
                ast.Constant(self.functions[-1]),
            ],
            ctx=ast.Load(),
        )

    def _fresh(self, kind, node):
        """ag__<kind>_<line>: the line of the statement it comes from (made unique)."""
        name, n = f"ag__{kind}_{node.lineno}", 1
        while name in self.names:
            n += 1
            name = f"ag__{kind}_{node.lineno}_{n}"
        self.names.add(name)
        return name

    def _modified(self, stmts):
        return _assigned(stmts) - self.declared[-1]

    def _def(self, name, params, body, results, node):
        """def name(params): <declarations> body; return (results)"""
        fn = ast.FunctionDef(
            name=name,
            args=ast.arguments(
                posonlyargs=[],
                args=[ast.arg(arg=p) for p in params],
                vararg=None,
                kwonlyargs=[],
                kw_defaults=[],
                kwarg=None,
                defaults=[],
            ),
            body=self._declarations()
            + list(body)
            + [ast.Return(value=self._results(body, results))],
            decorator_list=[],
            returns=None,
            type_comment=None,
        )
        return fn

    def _results(self, body, results):
        """(results): a tuple of the names, or, when the body may `del` one, their values or
        Undefined read from locals()."""
        deleted = {
            n.id
            for s in body
            for n in _walk_scope(s, enter=False)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Del)
        }
        if not deleted & set(results):
            return _tuple(results)
        return _call(
            "state", ast.Call(func=_name("locals"), args=[], keywords=[]), _strings(results)
        )

    def _declarations(self):
        """The enclosing function's global/nonlocal declarations, repeated in a new function
        so that its assignments reach the same variables."""
        globals_, nonlocals = self.globals[-1], self.declared[-1] - self.globals[-1]
        out = []
        if globals_:
            out.append(ast.Global(names=sorted(globals_)))
        if nonlocals:
            out.append(ast.Nonlocal(names=sorted(nonlocals)))
        return out

    def _assign(self, names, value):
        if not names:
            return ast.Expr(value=value)
        return ast.Assign(targets=[_tuple(names, store=True)], value=value)

    def _test(self, expr):
        """A test expression with `and`/`or`/`not` that work on traced tensors."""
        if isinstance(expr, ast.BoolOp):
            helper = "and_" if isinstance(expr.op, ast.And) else "or_"
            out = self._test(expr.values[0])
            for v in expr.values[1:]:
                out = _call(helper, _lambda(out), _lambda(self._test(v)))
            return out
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
            return _call("not_", self._test(expr.operand))
        simple = (ast.Name, ast.Constant)
        if (
            isinstance(expr, ast.Compare)
            and len(expr.ops) > 1
            and all(isinstance(c, simple) for c in expr.comparators[:-1])
        ):
            # a < b < c -> (a < b) and (b < c): b is evaluated twice, so only names/constants.
            operands = [expr.left] + expr.comparators
            pairs = [
                ast.Compare(left=operands[i], ops=[op], comparators=[operands[i + 1]])
                for i, op in enumerate(expr.ops)
            ]
            return self._test(ast.BoolOp(op=ast.And(), values=pairs))
        return expr

    def _escape_reason(self, node, stmts, loop_level):
        """Why the statement cannot become functions, or None."""
        found = _escapes(stmts, loop_level)
        if found is not None:
            return f"`{_ESCAPE_NAMES[type(found)]}` at line {found.lineno}"
        for s in stmts:
            for n in _walk_scope(s, enter=False):
                if (
                    isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Name)
                    and n.func.id == "super"
                    and not n.args
                ):
                    return f"`super()` without arguments at line {n.lineno}"
        if isinstance(node, ast.While) and any(
            isinstance(n, ast.NamedExpr) for n in ast.walk(node.test)
        ):
            return "`:=` in its condition"
        return None

    def _finish(self, node, stmts):
        """Gives the new statements the position of the statement's test (its `if`/`while`
        line), so tracebacks and Kiln's errors point there."""
        where = node.iter if isinstance(node, ast.For) else node.test
        for s in stmts:
            for n in ast.walk(s):
                if "lineno" in n._attributes and getattr(n, "lineno", None) is None:
                    ast.copy_location(n, where)
        return stmts

    # -- statements --

    def visit_If(self, node):
        reason = self._escape_reason(node, node.body + node.orelse, 0)
        live = self.liveness[-1]
        after = live.after[node]
        modified = self._modified(node.body + node.orelse)
        self.generic_visit(node)
        if reason:
            node.test = _call(
                "guard",
                node.test,
                self._loc(node),
                ast.Constant("`if`"),
                ast.Constant(f"it contains {reason}"),
            )
            return node
        outputs = sorted(modified & after)
        reads = _reads(ast.Module(body=node.body + node.orelse, type_ignores=[]))
        params = sorted(modified & (after | reads))
        true_name, false_name = self._fresh("if_true", node), self._fresh("if_false", node)
        true_fn = self._def(true_name, params, node.body, outputs, node)
        false_fn = self._def(false_name, params, node.orelse or [ast.Pass()], outputs, node)
        call = _call(
            "if_stmt",
            self._test(node.test),
            _name(true_name),
            _name(false_name),
            _call("state", ast.Call(func=_name("locals"), args=[], keywords=[]), _strings(params)),
            _strings(outputs),
            self._loc(node),
        )
        return self._finish(node, [true_fn, false_fn, self._assign(outputs, call)])

    def visit_While(self, node):
        reason = self._escape_reason(node, node.body, 0)
        live = self.liveness[-1]
        header = live.header[node]
        modified = self._modified(node.body)
        self.generic_visit(node)
        if reason:
            node.test = _call(
                "guard",
                node.test,
                self._loc(node),
                ast.Constant("`while` loop"),
                ast.Constant(f"its body contains {reason}"),
            )
            return node
        carries = sorted(modified & header)
        test_name, body_name = self._fresh("while_test", node), self._fresh("while_body", node)
        test_fn = self._def(test_name, carries, [], [], node)
        test_fn.body[-1] = ast.Return(value=self._test(node.test))
        body_fn = self._def(body_name, carries, node.body, carries, node)
        call = _call(
            "while_stmt",
            _name(test_name),
            _name(body_name),
            _call("state", ast.Call(func=_name("locals"), args=[], keywords=[]), _strings(carries)),
            _strings(carries),
            self._loc(node),
        )
        return self._finish(node, [test_fn, body_fn, self._assign(carries, call)] + node.orelse)

    def visit_For(self, node):
        reason = self._escape_reason(node, node.body, 0)
        live = self.liveness[-1]
        header = live.header[node]
        targets = _assigned([node.target])
        modified = self._modified(node.body) | (targets - self.declared[-1])
        is_range = (
            isinstance(node.iter, ast.Call)
            and isinstance(node.iter.func, ast.Name)
            and node.iter.func.id == "range"
            and not node.iter.keywords
            and 1 <= len(node.iter.args) <= 3
            and not any(isinstance(a, ast.Starred) for a in node.iter.args)
        )
        if is_range:  # range itself is passed to the helper, not called through ag__.callee
            range_name = node.iter.func
            self.generic_visit(node)
            node.iter.func = range_name
        else:
            self.generic_visit(node)
        if (
            reason
            or not isinstance(node.target, (ast.Name, ast.Tuple, ast.List))
            or targets & self.declared[-1]
        ):
            if is_range and reason:
                node.iter = _call(
                    "guard_range",
                    node.iter.func,
                    ast.Tuple(elts=node.iter.args, ctx=ast.Load()),
                    self._loc(node),
                    ast.Constant(f"its body contains {reason}"),
                )
            return node
        carries = sorted(modified & header)
        body_name = self._fresh("for_body", node)
        body_fn = self._def(
            body_name,
            ["ag__item"] + carries,
            [ast.Assign(targets=[node.target], value=_name("ag__item"))] + node.body,
            carries,
            node,
        )
        state = _call(
            "state", ast.Call(func=_name("locals"), args=[], keywords=[]), _strings(carries)
        )
        flag = ast.Constant(getattr(node, "ag_break", None))
        carried_targets = _strings(sorted(targets & set(carries)))
        if is_range:
            call = _call(
                "for_range",
                node.iter.func,
                ast.Tuple(elts=node.iter.args, ctx=ast.Load()),
                _name(body_name),
                state,
                _strings(carries),
                carried_targets,
                flag,
                self._loc(node),
            )
        else:
            call = _call(
                "for_stmt",
                node.iter,
                _name(body_name),
                state,
                _strings(carries),
                carried_targets,
                flag,
                self._loc(node),
            )
        return self._finish(node, [body_fn, self._assign(carries, call)] + node.orelse)


# ---------------------------------------------------------------------------------------------
# Converting a function: find its source, rewrite it, compile it with the function's own
# globals and closure cells.
# ---------------------------------------------------------------------------------------------


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
    module = sys.modules[__name__]
    cells = dict(zip(fun.__code__.co_freevars, fun.__closure__ or ()))
    closure = tuple(
        _cell(module) if name == "ag__" else cells[name] for name in conversion.code.co_freevars
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
    return callee(fun) if getattr(_local, "jit_depth", 0) else fun


_kiln._set_autograph_entry(_entry)


def _unconverted_frames(tb):
    """(code, why) for the frames of the traceback `tb` that run the user's code unconverted,
    outermost first; `why`: the reason conversion gave, or None when it was never asked (the
    function was called from unconverted code)."""
    out = []
    while tb is not None:
        code = tb.tb_frame.f_code
        if code not in _converted_codes and _is_user_code(code):
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
        depth = getattr(_local, "jit_depth", 0)
        _local.jit_depth = depth + 1
        try:
            return convert(fun)(*args, **kwargs)  # cached after the first trace
        except _kiln.Error as exc:
            hinted = _concrete_value_hint(exc)
            if hinted is exc:
                raise
            raise hinted.with_traceback(exc.__traceback__) from None
        finally:
            _local.jit_depth = depth

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
