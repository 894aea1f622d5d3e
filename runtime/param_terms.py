"""Runtime layer: a declaration's parameter-only terms, checked finite in float32 when a cache is built.

A parameter can be finite and still make every sequence's state NaN: Mamba-2's and GDN's decay hold
``exp(A_log)``, which overflows float32 for ``A_log`` > 88.7. The kernels compute such terms in float32
like the rest of a field, so each term that reads parameters and no token (the smallest first) is
evaluated here on the host parameters in float32, and a term that is not finite is refused, naming
its parameters, the field and the index. Parameters on the GPU are left to the caller, as their
values are elsewhere (``ReplayCacheBase``: device arrays are checked for shape and dtype only).

May import: NumPy, ``replayssm_dsl``.
"""

from __future__ import annotations

import numpy as np

from replayssm_dsl.config import ModelShape
from replayssm_dsl.declaration import Declaration
from replayssm_dsl.errors import InputError
from replayssm_dsl.evaluate import evaluate
from replayssm_dsl.expr import LEAF_OPS, render_text


def _parameter_terms(decl: Declaration):
    """``(field, node)`` for every node above the leaves that reads parameters and no token, each once,
    operands before their users."""
    seen = set()
    for field, root in decl.expressions().items():
        for node in root.walk():
            if id(node) in seen or node.op in LEAF_OPS or node.leaves("INPUT") or not node.leaves("PARAM"):
                continue
            seen.add(id(node))
            yield field, node


def check_parameter_terms(decl: Declaration, shape: ModelShape, params: dict) -> None:
    """Raise ``InputError`` for the first parameter-only term of ``decl`` that ``params`` (host arrays by
    name) make non-finite in float32."""
    for field, node in _parameter_terms(decl):
        names = sorted({leaf.arg for leaf in node.leaves("PARAM")})
        if any(not isinstance(params[name], np.ndarray) for name in names):
            continue  # a device array's values stay on the device
        with np.errstate(all="ignore"):
            value = evaluate(node, {name: params[name].astype(np.float32) for name in names}, shape,
                             dtype=np.float32)
        bad = np.argwhere(~np.isfinite(value))
        if bad.size:
            index = [int(i) for i in (bad[0][:-1] if value.shape[-1] == 1 else bad[0])]
            raise InputError(f"params{names}: {render_text(node)} = {value[tuple(bad[0])]} at index {index}, "
                             f"a term of the {field} that the kernels compute in float32")

