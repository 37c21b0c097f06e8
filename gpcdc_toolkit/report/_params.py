"""A notebook's parameters: what its ``parameters`` cell declares, values given on a
command line checked and converted against it, and secrets kept out of it.

Pure: works on the notebook's JSON and on strings."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

_TYPES = {"bool": bool, "int": int, "float": float, "str": str}
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")
# Settings that hold secrets, by name, and secrets inside a DSN (key=value or URL form).
_SECRET_NAME = re.compile(r"(^|_)(password|passwd|pwd|secret|token|sasl|credentials?)(_|$)", re.IGNORECASE)
_DSN_PASSWORD = re.compile(r"(?:^|[\s?&;])password\s*=|://[^/@\s:]*:[^/@\s]+@", re.IGNORECASE)


@dataclass(frozen=True)
class Parameter:
    name: str
    types: tuple[type, ...]  # what a value may be (None aside)
    optional: bool  # None is a value
    default: Any
    help: str = ""

    @property
    def kind(self) -> str:
        names = " or ".join(t.__name__ for t in self.types)
        return f"{names} or None" if self.optional else names


def declared_parameters(notebook: Mapping[str, Any]) -> dict[str, Parameter]:
    """The parameters of the cell tagged ``parameters``: ``name = default`` with the
    default's type, or ``name: type | None = default`` with the annotation's."""
    cells = [c for c in notebook.get("cells", []) if "parameters" in c.get("metadata", {}).get("tags", [])]
    if not cells:
        raise ConfigError("the notebook has no cell tagged 'parameters'",
                          fix="tag the cell that assigns its parameters with 'parameters'")
    source = "".join(cells[0]["source"])
    try:
        body = ast.parse(source).body
    except SyntaxError as e:
        raise ConfigError(f"the parameters cell is not Python (line {e.lineno}: {e.msg})",
                          fix="write its parameters as plain assignments: name = literal") from None
    out: dict[str, Parameter] = {}
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            name, value, annotation = node.target.id, node.value, node.annotation
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value, annotation = node.targets[0].id, node.value, None
        else:
            continue
        try:
            default = ast.literal_eval(value)
        except ValueError:
            raise ConfigError(f"parameter {name}'s default {ast.unparse(value)!r} is not a literal",
                              fix=f"give {name} a plain value (a number, a string, True, False or None)") from None
        types, optional = _annotated(annotation) if annotation is not None else _of(default)
        out[name] = Parameter(name, types, optional or default is None, default, _comment(source, node))
    return out


def _comment(source: str, node: ast.stmt) -> str:
    """The comment after an assignment, on its last line."""
    line = source.splitlines()[(node.end_lineno or node.lineno) - 1]
    rest = line.encode()[node.end_col_offset or 0:].decode(errors="replace")
    return rest.strip().removeprefix("#").strip()


def _annotated(annotation: ast.expr) -> tuple[tuple[type, ...], bool]:
    names = [n.strip() for n in ast.unparse(annotation).split("|")]
    unknown = [n for n in names if n not in _TYPES and n != "None"]
    if unknown:
        raise ConfigError(f"the parameters cell annotates with {', '.join(unknown)}",
                          fix=f"annotate parameters with {', '.join(_TYPES)} or None")
    return tuple(_TYPES[n] for n in names if n != "None"), "None" in names


def _of(default: Any) -> tuple[tuple[type, ...], bool]:
    if default is None:
        return (str,), True
    if type(default) not in _TYPES.values():
        raise ConfigError(f"a parameter's default {default!r} is a {type(default).__name__}",
                          fix=f"give parameters a value of type {', '.join(_TYPES)}, or None")
    return (type(default),), False


def convert(parameter: Parameter, raw: str) -> Any:
    """A command-line string as a value of ``parameter``'s type; ConfigError otherwise."""
    if parameter.optional and raw in ("None", "none", "null"):
        return None
    for kind in parameter.types:
        if kind is bool:
            if raw.lower() in _TRUE + _FALSE:
                return raw.lower() in _TRUE
        elif kind is str:
            return raw
        else:
            try:
                return kind(raw)
            except ValueError:
                pass
    raise ConfigError(f"parameter {parameter.name} takes {parameter.kind}, not {raw!r}",
                      fix=f"give -p {parameter.name} with a value of that type")


def check_parameters(declared: Mapping[str, Parameter], given: Mapping[str, Any], notebook: str) -> dict[str, Any]:
    """``given`` checked against ``declared``: strings converted, other values type-checked,
    no unknown name, no secret."""
    out: dict[str, Any] = {}
    for name, value in given.items():
        parameter = declared.get(name)
        if parameter is None:
            raise ConfigError(f"notebook {notebook} has no parameter {name!r}",
                              fix=f"its parameters: {', '.join(declared) or 'none'}")
        if isinstance(value, str):  # from a command line: "None" is None where None is a value
            value = convert(parameter, value)
        elif not (value is None and parameter.optional or _fits(value, parameter.types)):
            raise ConfigError(f"parameter {name} takes {parameter.kind}, not {type(value).__name__} {value!r}",
                              fix=f"give {name} a value of that type")
        refuse_secret(name, value)
        out[name] = value
    return out


def _fits(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in types
    return isinstance(value, types) or (isinstance(value, int) and float in types)


def refuse_secret(name: str, value: Any) -> None:
    """A parameter is stored in the executed notebook: refuse one that holds a secret."""
    if value is None or value == "":
        return
    if _SECRET_NAME.search(name) or (isinstance(value, str) and _DSN_PASSWORD.search(value)):
        raise ConfigError(f"parameter {name} holds a password or another secret, and parameters are stored in "
                          "the executed notebook", fix="give secrets through the environment (PGPASSWORD, "
                          "GPCDC_SOURCE_DSN, ...), ~/.pgpass or the configuration file instead")


def sql_names(text: str | None) -> list[str] | None:
    """Table names as SQL writes them, separated by commas (a comma or a doubled quote
    inside double quotes belongs to the name); None for None."""
    if text is None:
        return None
    names: list[str] = []
    current: list[str] = []
    quoted = False
    for char in text:
        if char == '"':
            quoted = not quoted
        if char == "," and not quoted:
            names.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    if quoted:
        raise ConfigError(f"unbalanced double quote in table names {text!r}", fix='close the quote: sales."Order Items"')
    names.append("".join(current).strip())
    if not all(names):
        raise ConfigError(f"an empty table name in {text!r}", fix="separate names by single commas")
    return names


def syncpoint_choice(text: str) -> bool | int:
    """A notebook's ``syncpoint`` parameter: "new" (True), "none" (False) or a sync point's id."""
    if text.lower() in ("new", "none"):
        return text.lower() == "new"
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise ConfigError(f"syncpoint {text!r} is neither 'new', 'none' nor a sync point's id",
                      fix="give new, none, or the id `gpcdc syncpoint --hold` printed")
