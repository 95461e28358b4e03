"""A small interpreter of the Go text/template subset gym's Ollama TEMPLATEs use, run the way Ollama
runs a chat template, so tests can render a conversation from a Modelfile without Ollama or Go.

Supported: text, `{{ }}` actions with `{{-` / `-}}` whitespace trimming, fields (`.Role`, `$.System`),
variables (`$i`, `$_`), string and integer literals, parentheses, `if` / `else if` / `else` / `end`,
`range PIPE` and `range $i, $_ := PIPE`, and the functions `eq`, `ne`, `and`, `or`, `not`, `len`,
`slice`. Anything else raises, so a template outside the subset fails loudly instead of rendering wrong.

`ollama_render(template, messages)` gives the template what Ollama's template.Execute does:
`.Messages` (consecutive messages of one role merged with a blank line, system messages included)
and `.System` (every system message, joined with a blank line).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.DOTALL)
_TOKEN = re.compile(r'\s*("(?:[^"\\]|\\.)*"|\(|\)|:=|,|[$.\w]+)')


@dataclass
class _Node:
    kind: str  # text, expr, if, range
    value: Any = None
    branches: list[tuple[list[str], list[_Node]]] = field(default_factory=list)
    otherwise: list[_Node] = field(default_factory=list)
    names: list[str] = field(default_factory=list)


def _lex(template: str) -> list[tuple[str, str]]:
    parts: list[tuple[str, str]] = []
    pos, trim_next = 0, False
    for m in _ACTION.finditer(template):
        text = template[pos : m.start()]
        if trim_next:
            text = text.lstrip()
        if m.group(1):
            text = text.rstrip()
        parts.append(("text", text))
        parts.append(("action", m.group(2).strip()))
        pos, trim_next = m.end(), bool(m.group(3))
    tail = template[pos:]
    parts.append(("text", tail.lstrip() if trim_next else tail))
    return parts


def _words(expr: str) -> list[str]:
    words, pos = [], 0
    while pos < len(expr.rstrip()):
        m = _TOKEN.match(expr, pos)
        if not m:
            raise ValueError(f"go_template: cannot read {expr[pos:]!r}")
        words.append(m.group(1))
        pos = m.end()
    return words


def _parse(parts: list[tuple[str, str]], i: int, stops: tuple[str, ...]) -> tuple[list[_Node], int]:
    nodes: list[_Node] = []
    while i < len(parts):
        kind, body = parts[i]
        if kind == "text":
            if body:
                nodes.append(_Node("text", body))
            i += 1
            continue
        head = body.split(None, 1)[0] if body else ""
        if head in stops or (body.startswith("else") and "else" in stops):
            return nodes, i
        if head == "if":
            node = _Node("if")
            cond = _words(body[2:])
            while True:
                block, i = _parse(parts, i + 1, ("end", "else"))
                node.branches.append((cond, block))
                tail = parts[i][1]
                if tail.startswith("else if"):
                    cond = _words(tail[len("else if") :])
                    continue
                if tail == "else":
                    node.otherwise, i = _parse(parts, i + 1, ("end",))
                break
            nodes.append(node)
        elif head == "range":
            words = _words(body[5:])
            names: list[str] = []
            if ":=" in words:
                at = words.index(":=")
                names, words = [w for w in words[:at] if w != ","], words[at + 1 :]
            block, i = _parse(parts, i + 1, ("end",))
            nodes.append(_Node("range", words, [([], block)], names=names))
        elif head in ("end", "else", "with", "define", "template", "block"):
            raise ValueError(f"go_template: unexpected {{{{ {body} }}}}")
        else:
            nodes.append(_Node("expr", _words(body)))
        i += 1
    if stops:
        raise ValueError("go_template: missing {{ end }}")
    return nodes, i


def _truthy(value: Any) -> bool:
    return bool(value)


_FUNCS = {
    "eq": lambda a, *bs: any(a == b for b in bs),
    "ne": lambda a, b: a != b,
    "not": lambda a: not _truthy(a),
    "len": len,
    "slice": lambda x, *ij: x[ij[0] : ij[1]] if len(ij) == 2 else x[ij[0] :] if ij else x,
}


def _field(value: Any, path: str) -> Any:
    for name in filter(None, path.split(".")):
        value = value[name] if isinstance(value, dict) else getattr(value, name)
    return value


class _Scope:
    def __init__(self, root: Any) -> None:
        self.root, self.dot, self.vars = root, root, {"$": root}

    def operand(self, word: str) -> Any:
        if word.startswith('"'):
            return bytes(word[1:-1], "utf-8").decode("unicode_escape")
        if word.isdigit():
            return int(word)
        if word == ".":
            return self.dot
        if word.startswith("."):
            return _field(self.dot, word)
        if word.startswith("$"):
            name, _, path = word.partition(".")
            return _field(self.vars[name], path)
        raise ValueError(f"go_template: unknown operand {word!r}")

    def command(self, words: list[str]) -> Any:
        args, i = [], 0
        while i < len(words):
            if words[i] == "(":
                depth, j = 1, i + 1
                while depth:
                    depth += {"(": 1, ")": -1}.get(words[j], 0)
                    j += 1
                args.append(("value", self.command(words[i + 1 : j - 1])))
                i = j
            else:
                args.append(("word", words[i]))
                i += 1
        head = args[0]
        if head[0] == "word" and head[1] in ("and", "or"):
            values = [self._value(a) for a in args[1:]]
            pick = (lambda v: not _truthy(v)) if head[1] == "and" else _truthy
            return next((v for v in values if pick(v)), values[-1])
        if head[0] == "word" and head[1] in _FUNCS:
            return _FUNCS[head[1]](*(self._value(a) for a in args[1:]))
        if len(args) != 1:
            raise ValueError(f"go_template: unknown function in {' '.join(words)!r}")
        return self._value(head)

    def _value(self, arg: tuple[str, Any]) -> Any:
        return arg[1] if arg[0] == "value" else self.operand(arg[1])


def _run(nodes: list[_Node], scope: _Scope, out: list[str]) -> None:
    for node in nodes:
        if node.kind == "text":
            out.append(node.value)
        elif node.kind == "expr":
            out.append(str(scope.command(node.value)))
        elif node.kind == "if":
            for cond, block in node.branches:
                if _truthy(scope.command(cond)):
                    _run(block, scope, out)
                    break
            else:
                _run(node.otherwise, scope, out)
        elif node.kind == "range":
            saved_dot, saved_vars = scope.dot, dict(scope.vars)
            for i, item in enumerate(scope.command(node.value)):
                scope.dot = item
                if len(node.names) == 2:
                    scope.vars[node.names[0]], scope.vars[node.names[1]] = i, item
                elif node.names:
                    scope.vars[node.names[0]] = item
                _run(node.branches[0][1], scope, out)
            scope.dot, scope.vars = saved_dot, saved_vars


def render(template: str, data: dict[str, Any]) -> str:
    nodes, _ = _parse(_lex(template), 0, ())
    out: list[str] = []
    _run(nodes, _Scope(data), out)
    return "".join(out)


def ollama_render(template: str, messages: list[dict[str, str]]) -> str:
    """The prompt Ollama builds from `messages` with this TEMPLATE (its template.Execute and collate)."""
    collated: list[dict[str, str]] = []
    for m in messages:
        if collated and collated[-1]["Role"] == m["role"]:
            collated[-1]["Content"] += "\n\n" + m["content"]
        else:
            collated.append({"Role": m["role"], "Content": m["content"]})
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    return render(template, {"System": system, "Messages": collated, "Response": ""})
