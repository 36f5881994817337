"""Replace column references by expressions (used when a rewrite moves an expression across a
projection)."""

from __future__ import annotations

from sqlglot import exp


def substitute(expression: exp.Expression, mapping: dict[str, exp.Expression]) -> exp.Expression:
    def replace(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and node.name in mapping:
            replacement = mapping[node.name].copy()
            return replacement if isinstance(replacement, (exp.Column, exp.Literal)) else exp.Paren(this=replacement)
        return node

    return expression.copy().transform(replace, copy=False)
