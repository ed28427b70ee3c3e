"""Control flow from native Python under `kiln.jit` (docs/PYTHON.md, "Python control flow under
jit (autograph)").

`convert(f)` rewrites the `if`, `while` and `for` statements of `f`'s source (Python's `ast`, as
TensorFlow's AutoGraph and MindSpore's graph mode do) into calls of the run-time helpers.
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

The modules, in the order a conversion uses them: `analysis` (which names a statement assigns
and which are live after it), `rewrite` (the statements into calls of the helpers), `conversion`
(a function's source rewritten and compiled: `convert`, `to_source`, `jit`) and `runtime` (the
helpers, which converted code reaches as `ag__`).
"""
from .conversion import convert, jit, to_source
from .runtime import Undefined, callee  # noqa: F401 (callee: kiln.autograph.callee)

__all__ = ["convert", "to_source", "jit", "Undefined"]
