"""A `for_each` resource over a local map, expanded into its instances as Terraform would plan them.

Only what infra/ writes in such a resource is evaluated: `${each.key}`, `${each.value.PATH}`
(alone, its value; inside a string, its text), a local named whole inside the map, `dynamic`
blocks over `each.value.PATH` with `ITERATOR.key` and `ITERATOR.value.PATH`, and
`{for K, V in each.value.PATH : K => V.FIELD}`. Anything else with `each.` in it is refused, so
a new construct fails here instead of being checked half-way. Other interpolations
(`${local.X}`, `${var.X}`) are left for the caller.
"""

from __future__ import annotations

import re
from typing import Any

from terraform_config import Terraform

_LOCAL = re.compile(r"^\$\{local\.([A-Za-z0-9_]+)\}$")
_FOR = re.compile(r"^\$\{\{for (\w+), (\w+) in (each\.value(?:\.\w+)+) : \1 => \2\.(\w+)\}\}$")
_REFERENCE = re.compile(r"\$\{((?:each|[a-z_]+)\.(?:key|value)(?:\.\w+)*)\}")


def instances(tf: Terraform, kind: str, name: str) -> dict[str, dict[str, Any]]:
    """Each instance of `kind.name` (a for_each over `local.X`) by its key, its body evaluated."""
    body = tf.resource(kind, name)
    source = _LOCAL.match(str(body.get("for_each", "")))
    assert source, f"{kind}.{name}: for_each is not a local value: {body.get('for_each')!r}"
    return {
        key: _evaluate({k: v for k, v in body.items() if k != "for_each"}, {"each": (key, value)})
        for key, value in _locals(tf.locals[source[1]], tf.locals).items()
    }


def _locals(value: Any, local_values: dict[str, Any]) -> Any:
    """A local value with the other locals it names whole (`family = local.family`) filled in."""
    if isinstance(value, dict):
        return {key: _locals(item, local_values) for key, item in value.items()}
    if isinstance(value, str) and (named := _LOCAL.match(value)):
        return _locals(local_values[named[1]], local_values)
    return value


def _lookup(path: str, scope: dict[str, tuple[str, Any]]) -> Any:
    """`each.key`, `labels.value.description`, ... in the iterators' scope."""
    iterator, part, *fields = path.split(".")
    assert iterator in scope, f"no iterator {iterator!r} in scope: {path}"
    key, value = scope[iterator]
    if part == "key":
        assert not fields, path
        return key
    for field in fields:
        assert isinstance(value, dict) and field in value, f"{path}: no {field!r}"
        value = value[field]
    return value


def _evaluate(node: Any, scope: dict[str, tuple[str, Any]]) -> Any:
    if isinstance(node, list):
        return [_evaluate(item, scope) for item in node]
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "dynamic":
                for entry in value:
                    for block, spec in entry.items():
                        out.setdefault(block, []).extend(_dynamic(block, spec, scope))
            else:
                out[key] = _evaluate(value, scope)
        return out
    if not isinstance(node, str):
        return node
    if found := _FOR.match(node):
        source, field = found[3], found[4]
        return {key: value[field] for key, value in _lookup(source, scope).items()}
    whole = _REFERENCE.fullmatch(node)
    if whole:
        return _lookup(whole[1], scope)
    text = _REFERENCE.sub(lambda m: str(_lookup(m[1], scope)), node)
    assert "each." not in text, f"an expression this helper cannot evaluate: {node!r}"
    return text


def _dynamic(block: str, spec: dict[str, Any], scope: dict[str, tuple[str, Any]]) -> list[dict[str, Any]]:
    """The blocks a `dynamic` makes: one `content` per item of its for_each (a map here)."""
    iterator = spec.get("iterator", block)
    items = _evaluate(spec["for_each"], scope)
    assert isinstance(items, dict), f"dynamic {block!r}: for_each is not a map: {spec['for_each']!r}"
    (content,) = spec["content"]
    return [_evaluate(content, {**scope, iterator: (key, value)}) for key, value in items.items()]
