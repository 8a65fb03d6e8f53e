"""Templates: ``{{ name }}`` and ``{{ user.name }}`` placeholders, rendered by Jinja2's sandbox.

Values are HTML-escaped in ``html`` and left as they are in ``subject`` and ``text``. A variable
the template uses but the request does not give is refused before anything renders, naming the
variable; a value may be left out only where the template says it is optional
(``{% if x is defined %}``, ``{{ x | default("friend") }}``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ..errors import ValidationFailed

if TYPE_CHECKING:
    from jinja2 import nodes
    from jinja2.sandbox import SandboxedEnvironment
_OPTIONAL_TESTS = {"defined", "undefined"}
_OPTIONAL_FILTERS = {"default", "d"}


@dataclass(frozen=True)
class Rendered:
    subject: str | None
    html: str | None
    text: str | None


def check_syntax(source: str | None, field: str) -> None:
    """:raises ValidationFailed: ``source`` is not a valid template; the message has the line."""
    if source is not None:
        _compiled(field == "html", source, field)


def render(
    subject: str | None, html: str | None, text: str | None, variables: dict[str, Any]
) -> Rendered:
    """Render each part that is given.

    :raises ValidationFailed: a variable is missing (named), or a part cannot be rendered.
    """
    parts = {"subject": subject, "html": html, "text": text}
    out: dict[str, str | None] = {}
    for field, source in parts.items():
        if source is None:
            out[field] = None
            continue
        compiled, required = _compiled(field == "html", source, field)
        missing = next((path for path in required if not _present(variables, path)), None)
        if missing is not None:
            raise ValidationFailed(
                f"variables.{'.'.join(missing)}: missing; the template's {field} uses it"
            )
        try:
            out[field] = compiled.render(variables)
        except Exception as exc:  # the template's own doing (a type error, the sandbox): 400
            raise ValidationFailed(f"{field}: the template could not be rendered: {exc}") from None
    return Rendered(**out)


@lru_cache(maxsize=2)
def _environment(html: bool) -> SandboxedEnvironment:
    # Jinja2 is imported on first use: a worker that never renders a template does not pay
    # its memory.
    from jinja2 import StrictUndefined
    from jinja2.sandbox import SandboxedEnvironment

    return SandboxedEnvironment(autoescape=html, undefined=StrictUndefined)


@lru_cache(maxsize=512)
def _compiled(html: bool, source: str, field: str) -> tuple[Any, tuple[tuple[str, ...], ...]]:
    from jinja2 import TemplateSyntaxError

    environment = _environment(html)
    try:
        tree = environment.parse(source)
        compiled = environment.from_string(tree)
    except TemplateSyntaxError as exc:
        raise ValidationFailed(
            f"{field}: template syntax error at line {exc.lineno}: {exc.message}"
        ) from None
    return compiled, _required_paths(tree)


def _required_paths(tree: nodes.Template) -> tuple[tuple[str, ...], ...]:
    """Every variable path the template reads unconditionally, shortest first."""
    from jinja2 import meta, nodes

    from_request = meta.find_undeclared_variables(tree)
    optional: set[int] = set()
    for guard in tree.find_all((nodes.Test, nodes.Filter)):
        if guard.name in _OPTIONAL_TESTS or guard.name in _OPTIONAL_FILTERS:
            optional.update(id(inner) for inner in _chain(guard.node))
    paths = set()
    for lookup in tree.find_all((nodes.Name, nodes.Getattr, nodes.Getitem)):
        path = _path(lookup)
        if path and path[0] in from_request and id(lookup) not in optional:
            paths.add(path)
    return tuple(sorted(paths, key=lambda path: (len(path), path)))


def _chain(node: nodes.Node | None) -> list[nodes.Node]:
    """A lookup chain (``user.address.city``) and each node it stands on."""
    from jinja2 import nodes

    chain: list[nodes.Node] = []
    while isinstance(node, nodes.Getattr | nodes.Getitem | nodes.Name):
        chain.append(node)
        node = getattr(node, "node", None)
    return chain


def _path(node: nodes.Node) -> tuple[str, ...] | None:
    from jinja2 import nodes

    parts: list[str] = []
    while isinstance(node, nodes.Getattr | nodes.Getitem):
        if isinstance(node, nodes.Getattr):
            parts.append(node.attr)
        elif isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
            parts.append(node.arg.value)
        else:
            return None
        node = node.node
    if isinstance(node, nodes.Name) and node.ctx == "load":
        return (node.name, *reversed(parts))
    return None


def _present(variables: Any, path: tuple[str, ...]) -> bool:
    value = variables
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return False
        value = value[part]
    return True
