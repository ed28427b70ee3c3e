"""The rewrite of kiln.autograph: a function's `if`, `while` and `for` statements into functions
and calls of the run-time helpers (runtime.py, reached as ag__.<name>) over the variables the
analysis (analysis.py) finds assigned and live."""
import ast

from .analysis import (
    _ESCAPE_NAMES,
    _assigned,
    _closures,
    _convert_returns,
    _escapes,
    _Liveness,
    _lower_jumps,
    _name,
    _reads,
    _walk_scope,
)

# Calls that look at their caller's frame: converted code calls them directly, not through
# ag__.callee.
_FRAME_BUILTINS = {"super", "locals", "globals", "vars", "dir", "eval", "exec"}


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
