"""Analysis of a function's AST for kiln.autograph: which names a statement assigns, which are
live (read before being reassigned) after it, and which `return`/`break`/`continue` leave it;
and the passes that, before the rewrite, turn `return`s inside `if`s into one assignment per
path and `break`/`continue` into flag variables."""
import ast
import copy

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


def _name(id_, store=False):
    """The node of the name `id_`, read or (`store`) assigned; the rewrite builds with it too."""
    return ast.Name(id=id_, ctx=ast.Store() if store else ast.Load())
