"""A griffe extension for the API reference: epochal's docstrings, written for Python readers
(Sphinx roles, doctest examples), rendered as Markdown that mkdocstrings shows as intended.

mkdocs.yml loads it (``mkdocstrings.handlers.python.options.extensions``). It rewrites each
docstring once the whole package is loaded (names resolve then, aliases included):

* ``:class:`~epochal.streams.Stream``` (any Sphinx role: class, func, meth, attr, mod, data,
  exc, obj) becomes an *optional* cross-reference — a link when the target is documented on
  some page, plain code otherwise (never a broken link, so ``--strict`` stays meaningful for
  the links written in the pages). ``~`` shows the last name only, as Sphinx does; a
  relative name (``:meth:`Dataflow.plan```) is resolved from the docstring's own scope.
* a doctest (``>>>`` lines with their ``...`` continuations and output) becomes a ``pycon``
  code block; Markdown would read its prompts as nested block quotes.
* a line that begins with ``>`` in prose (a wrapped ``> x``) is escaped, not a quote.
* a default value that names a private placeholder (``initial=_MISSING``) is shown as ``...``.

``tests/test_docs.py`` builds the site and checks that no raw role or doctest prompt is left
in the HTML.
"""
from __future__ import annotations

import html
import re

import griffe

_ROLE = re.compile(r":(?:py:)?(class|func|meth|attr|mod|data|exc|obj|const|type):`(~?)([^`<>]+?)(?:\s*<([^`>]+)>)?`")
_PROMPT = re.compile(r"^(\s*)>>> ?")
_PRIVATE_DEFAULT = re.compile(r"^_[A-Za-z0-9_]*$")


class EpochalMarkup(griffe.Extension):
    """Rewrites roles, doctests and private defaults (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        for obj in _walk(pkg, set()):
            if obj.docstring is not None:
                obj.docstring.value = rewrite(obj.docstring.value, obj)
            for param in getattr(obj, "parameters", None) or ():
                if param.default is not None and _PRIVATE_DEFAULT.match(str(param.default)):
                    param.default = "..."


def _walk(obj, seen: set):
    if id(obj) in seen or getattr(obj, "is_alias", False):
        return
    seen.add(id(obj))
    yield obj
    for member in list(obj.members.values()):
        if not getattr(member, "is_alias", False):
            yield from _walk(member, seen)


def rewrite(text: str, scope=None) -> str:
    """The docstring ``text`` with roles as cross-references and doctests as code blocks."""
    return _roles(_doctests(text), scope)


def _roles(text: str, scope) -> str:
    def link(m: re.Match) -> str:
        short, name, explicit = m.group(2), m.group(3).strip(), m.group(4)
        target = (explicit or name).strip().rstrip("()")
        shown = name.rstrip("()").rsplit(".", 1)[-1] if short else name
        return (f'<autoref identifier="{html.escape(_resolve(target, scope), quote=True)}" optional>'
                f"<code>{html.escape(shown)}</code></autoref>")

    return _ROLE.sub(link, text)


def _resolve(name: str, scope) -> str:
    """``name`` as a full dotted path, looked up from ``scope`` and its parents."""
    if name.startswith("epochal.") or scope is None:
        return name
    head, _, rest = name.partition(".")
    obj = scope
    while obj is not None:
        try:
            found = obj.resolve(head)
        except Exception:  # noqa: BLE001 - griffe raises NameResolutionError, or fails on odd scopes
            found = None
        if found:
            return f"{found}.{rest}" if rest else found
        obj = obj.parent
    return name


def _doctests(text: str) -> str:
    out: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = _PROMPT.match(lines[i])
        if not m:
            line = lines[i]
            stripped = line.lstrip()
            if stripped.startswith(">") and not stripped.startswith(">>>"):
                line = line[: len(line) - len(stripped)] + "\\" + stripped
            out.append(line)
            i += 1
            continue
        indent = m.group(1)
        block = []
        while i < len(lines) and lines[i].strip() and lines[i].startswith(indent):
            block.append(lines[i][len(indent):])
            i += 1
        out.extend([f"{indent}```pycon", *(indent + b for b in block), f"{indent}```"])
    return "\n".join(out)
