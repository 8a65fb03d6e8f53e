"""Templates: ``{{ name }}`` and ``{{ user.name }}`` placeholders, rendered in a bounded Jinja2
sandbox (:mod:`.sandbox`).

Values are HTML-escaped in ``html`` and left as they are in ``subject`` and ``text``. A variable
the template uses but the request does not give is refused before anything renders, naming the
variable; a value may be left out only where the template says it is optional
(``{% if x is defined %}``, ``{{ x | default("friend") }}``).

Every limit is a setting (:class:`TemplateLimits`) or a constant below, and going over one is a
400 that names it. Before a part is parsed, its size and its tags are counted with one regular
expression (parsing costs about 30 µs a node and compiling 40 µs more, so 100 KB of
placeholders would take seconds); after parsing, its nodes. Compiled templates are kept in a
cache bounded in bytes.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ValidationFailed
from ..limits.render_budget import MAX_ITEMS, AccountCpuSpent, Budget, RenderLimit, cpu_now
from ..ops import metrics

if TYPE_CHECKING:
    from jinja2 import nodes

    from ..settings import Settings
    from .sandbox import BoundedEnvironment

#: Tags (``{{ }}``, ``{% %}``, ``{# #}``) in one part, and characters inside them, at most.
MAX_TAGS = 500
MAX_TAG_CHARS = 10_000
#: Nodes of one part's parsed tree, at most (about 0.2 s to compile on a 2-core machine).
MAX_NODES = 2_500
#: Text a render may make along the way, as a multiple of the output limit.
WORKING_TEXT_FACTOR = 8
_TAG = re.compile(r"\{([{%#])(.*?)[}%#]\}", re.S)
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_OPTIONAL_TESTS = {"defined", "undefined"}
_OPTIONAL_FILTERS = {"default", "d"}


@dataclass(frozen=True)
class TemplateLimits:
    max_source_chars: int
    max_output_chars: int
    render_cpu_ms: int
    cache_bytes: int

    @classmethod
    def from_settings(cls, settings: Settings) -> TemplateLimits:
        return cls(
            settings.template_max_source_chars,
            settings.template_max_output_chars,
            settings.template_render_cpu_ms,
            settings.template_cache_bytes,
        )


@dataclass(frozen=True)
class Rendered:
    subject: str | None
    html: str | None
    text: str | None


@dataclass(frozen=True)
class _Compiled:
    template: Any
    #: Every variable path the template reads unconditionally, shortest first.
    required: tuple[tuple[str, ...], ...]
    cost: int


def check_template(source: str | None, part: str, limits: TemplateLimits) -> None:
    """:raises ValidationFailed: ``source`` is over a limit or does not compile; the message
    names the part, and the line where Jinja gives one."""
    if source is not None:
        _compiled(part == "html", source, part, limits)


def render(
    subject: str | None,
    html: str | None,
    text: str | None,
    variables: dict[str, Any],
    limits: TemplateLimits,
    account_cpu_ms: float | None = None,
) -> Rendered:
    """Render each part that is given, all of them within one render's CPU time, and within
    ``account_cpu_ms`` when that is less (what the account has left).

    :raises ValidationFailed: a variable is missing (named), a limit is reached (named), or a
        part cannot be rendered.
    :raises AccountCpuSpent: the render used ``account_cpu_ms``.
    """
    check_variables(variables, limits)
    chars = WORKING_TEXT_FACTOR * limits.max_output_chars
    allowed_ms = min(limits.render_cpu_ms, account_cpu_ms or limits.render_cpu_ms)
    account_bound = allowed_ms < limits.render_cpu_ms
    started = cpu_now()
    budget = Budget(
        started + allowed_ms / 1000,
        limits.render_cpu_ms,
        chars,
        chars,
        account_bound=account_bound,
        started=started,
        max_text=limits.max_output_chars,
    )
    out: dict[str, str | None] = {}
    metrics.RENDERS.inc()
    try:
        for part, source in (("subject", subject), ("html", html), ("text", text)):
            if source is None:
                out[part] = None
                continue
            compiled = _compiled(part == "html", source, part, limits)
            required = compiled.required
            missing = next((path for path in required if not _present(variables, path)), None)
            if missing is not None:
                raise ValidationFailed(
                    f"variables.{'.'.join(missing)}: missing; the template's {part} uses it"
                )
            out[part] = _render_part(compiled, variables, part, budget, limits)
    finally:
        metrics.RENDERS.dec()
    return Rendered(**out)


def check_variables(variables: dict[str, Any], limits: TemplateLimits) -> None:
    """:raises ValidationFailed: a list or object in ``variables`` has more than
    :data:`~.budget.MAX_ITEMS` items, or a text more characters than a render may print (what
    a template is given, it could otherwise sort, group or search for longer than its CPU
    limit in one step)."""
    longest = limits.max_output_chars
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(variables, ())]
    while stack:
        value, path = stack.pop()
        if len(value) > MAX_ITEMS:
            raise ValidationFailed(f"{_variable(path)}: at most {MAX_ITEMS} items")
        for key, item in value.items() if isinstance(value, dict) else enumerate(value):
            if isinstance(item, dict | list):
                stack.append((item, (*path, key)))
            elif isinstance(item, str) and len(item) > longest:
                raise ValidationFailed(
                    f"{_variable((*path, key))}: at most {longest} characters "
                    f"(MAILSVC_TEMPLATE_MAX_OUTPUT_CHARS)"
                )


def _variable(path: tuple[str | int, ...]) -> str:
    return "variables" + "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" for part in path
    )


def _render_part(
    compiled: _Compiled,
    variables: dict[str, Any],
    part: str,
    budget: Budget,
    limits: TemplateLimits,
) -> str:
    from ..limits.render_budget import run_with

    def stream() -> str:
        chunks, size = [], 0
        for chunk in compiled.template.generate(variables):
            size += len(chunk)
            if size > limits.max_output_chars:
                raise ValidationFailed(
                    f"{part}: the rendered {part} is over {limits.max_output_chars} characters "
                    f"(MAILSVC_TEMPLATE_MAX_OUTPUT_CHARS)"
                )
            chunks.append(chunk)
        return "".join(chunks)

    try:
        return str(run_with(budget, stream))
    except (ValidationFailed, AccountCpuSpent):
        raise
    except RenderLimit as exc:
        raise ValidationFailed(f"{part}: {exc}") from None
    except RecursionError:
        raise ValidationFailed(f"{part}: the template recurses too deeply") from None
    except Exception as exc:  # the template's own doing (a type error, the sandbox): a 400
        raise ValidationFailed(
            f"{part}: the template could not be rendered: {_said(exc)}"
        ) from None


# -- compiling, and the cache -----------------------------------------------------------------


class _Cache:
    """Compiled templates by part kind and source digest, least recently used first out,
    holding at most ``limit`` bytes (as estimated when each is compiled)."""

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[bool, bytes], _Compiled] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[bool, bytes]) -> _Compiled | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: tuple[bool, bytes], entry: _Compiled, limit: int) -> None:
        with self._lock:
            if key in self._entries or entry.cost > limit:
                return
            self._entries[key] = entry
            self._bytes += entry.cost
            while self._bytes > limit:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.cost

    @property
    def size(self) -> int:
        return self._bytes


_CACHE = _Cache()
_ENVIRONMENTS: dict[bool, BoundedEnvironment] = {}


def _environment(html: bool) -> BoundedEnvironment:
    # Jinja2 is imported on first use: a worker that never renders a template does not pay
    # its memory.
    if html not in _ENVIRONMENTS:
        from .sandbox import BoundedEnvironment

        _ENVIRONMENTS[html] = BoundedEnvironment(autoescape=html)
    return _ENVIRONMENTS[html]


def _compiled(html: bool, source: str, part: str, limits: TemplateLimits) -> _Compiled:
    key = (html, hashlib.sha256(source.encode("utf-8", "surrogatepass")).digest())
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    _check_size(source, part, limits)
    from jinja2 import TemplateSyntaxError, nodes

    environment = _environment(html)
    try:
        tree = environment.parse(source)
        count = sum(1 for _ in tree.find_all(nodes.Node))
        if count > MAX_NODES:
            raise ValidationFailed(
                f"{part}: the template is too complex ({count} nodes; at most {MAX_NODES})"
            )
        if next(
            tree.find_all((nodes.Include, nodes.Extends, nodes.Import, nodes.FromImport)), None
        ):
            raise ValidationFailed(
                f"{part}: the template cannot be compiled: include, extends and import are not "
                f"available (a template stands alone)"
            )
        required = _required_paths(tree)
        from .sandbox import guard

        template = environment.from_string(guard(tree, environment))
    except ValidationFailed:
        raise
    except TemplateSyntaxError as exc:
        raise ValidationFailed(
            f"{part}: template syntax error at line {exc.lineno}: {exc.message}"
        ) from None
    except (RecursionError, MemoryError):
        raise ValidationFailed(f"{part}: the template is nested too deeply") from None
    except SyntaxError as exc:  # Python's compiler on what Jinja generated ("too many nested")
        raise ValidationFailed(f"{part}: the template cannot be compiled: {exc.msg}") from None
    except Exception as exc:
        raise ValidationFailed(f"{part}: the template cannot be compiled: {_said(exc)}") from None
    # A compiled template keeps about twice its source, and about 200 bytes a node (measured
    # with tracemalloc on Jinja 3.1).
    entry = _Compiled(template, required, 2 * len(source) + 200 * count)
    _CACHE.put(key, entry, limits.cache_bytes)
    return entry


def _check_size(source: str, part: str, limits: TemplateLimits) -> None:
    if len(source) > limits.max_source_chars:
        raise ValidationFailed(
            f"{part}: at most {limits.max_source_chars} characters "
            f"(MAILSVC_TEMPLATE_MAX_SOURCE_CHARS)"
        )
    tags = _TAG.findall(source)
    if len(tags) > MAX_TAGS:
        raise ValidationFailed(f"{part}: at most {MAX_TAGS} tags ({{{{ }}}}, {{% %}}, {{# #}})")
    if sum(len(inside) for _, inside in tags) > MAX_TAG_CHARS:
        raise ValidationFailed(f"{part}: at most {MAX_TAG_CHARS} characters inside tags in all")


def _said(exc: BaseException) -> str:
    """An exception's message for the client: short, and without Python memory addresses."""
    text = _ADDRESS.sub("", str(exc))
    return text if len(text) <= 200 else text[:197] + "..."


# -- which variables a template needs -----------------------------------------------------------


def _required_paths(tree: nodes.Template) -> tuple[tuple[str, ...], ...]:
    """Every variable path the template reads unconditionally, shortest first."""
    from jinja2 import meta, nodes

    from_request = meta.find_undeclared_variables(tree)
    # ``d.items()`` calls a method of ``d``: ``d`` is needed, not a variable ``d.items``.
    called = {id(call.node) for call in tree.find_all(nodes.Call)}
    optional: set[int] = set()
    for guard in tree.find_all((nodes.Test, nodes.Filter)):
        if guard.name in _OPTIONAL_TESTS or guard.name in _OPTIONAL_FILTERS:
            optional.update(id(inner) for inner in _chain(guard.node))
    paths = set()
    for lookup in tree.find_all((nodes.Name, nodes.Getattr, nodes.Getitem)):
        path = _path(lookup)
        if path and path[0] in from_request and id(lookup) not in optional | called:
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
