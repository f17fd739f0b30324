"""Reading a policy: YAML with unique keys, parsed strictly; errors name the key and the fix."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gateway.errors import PolicyError
from gateway.policy.model import Policy


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader under YAML 1.2's core schema, rejecting a key given twice (PyYAML silently
    keeps the last one).

    PyYAML resolves plain scalars by YAML 1.1: ``k: 1:30`` reads as 90 (base 60), ``010`` as
    8, ``0x10`` as 16 and ``1_0`` as 10, and a category ``NO`` (Norway) or ``yes`` as a
    boolean, all silently. Under the core schema numbers are decimal and booleans are true and
    false; the rest is text, which the strict model refuses where it wants a number (a leading
    0, as in ``010``, is no number either)."""


_CORE_SCALARS = (
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?(?:0|[1-9][0-9]*))$", "-+0123456789"),
    (
        "tag:yaml.org,2002:float",
        r"^(?:[-+]?(?:\.[0-9]+|(?:0|[1-9][0-9]*)(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        "-+.0123456789",
    ),
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", "~nN"),
    ("tag:yaml.org,2002:merge", r"^(?:<<)$", "<"),
)
_UniqueKeyLoader.yaml_implicit_resolvers = {"": [("tag:yaml.org,2002:null", re.compile("^$"))]}
for _tag, _pattern, _first in _CORE_SCALARS:
    _UniqueKeyLoader.add_implicit_resolver(_tag, re.compile(_pattern), list(_first))


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # a merge (<<: *anchor) gives defaults the keys written here override
        key = loader.construct_object(key_node)
        if key in seen:
            raise PolicyError(
                f"policy line {key_node.start_mark.line + 1}: key '{key}' is given twice; "
                "name each attribute and setting once"
            )
        seen.add(key)
    loader.flatten_mapping(node)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _format_loc(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif not item.startswith("function-") and item != "[key]":  # (a mapping's key)
            shown = item if item and item.isprintable() else repr(item)  # as written: may not be
            parts.append(("." if parts else "") + shown)
    return "".join(parts) or "policy"


_STRICT_TYPES = {
    "int_type": "must be a whole number, written without quotes in decimal digits (e.g. 5; "
    "1:30, 010, 0x10 and 1_0 are text)",
    "float_type": "must be a number, written without quotes in decimal digits (e.g. 0.2 or 1e3)",
    "bool_type": "must be true or false, written without quotes",
    "finite_number": "must be a finite number (.inf and .nan are not settings); give a value",
}


def _format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors(include_url=False, include_input=False):
        loc = _format_loc(tuple(e["loc"]))
        msg = str(e["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key; remove it or fix its spelling (see docs/policy.md)"
        elif e["type"] == "missing":
            msg = "required key is missing"
        elif e["type"] in _STRICT_TYPES:
            msg = _STRICT_TYPES[e["type"]]
        lines.append(f"{loc}: {msg}")
    return "invalid policy:\n  " + "\n  ".join(lines)


def parse_policy(data: object) -> Policy:
    if not isinstance(data, dict):
        raise PolicyError("invalid policy: the top level must be a mapping of settings")
    try:
        return Policy.model_validate(data)
    except ValidationError as err:
        raise PolicyError(_format_validation_error(err)) from None


def policy_from_yaml(text: str) -> Policy:
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise PolicyError(
            f"policy is not valid YAML{where}: {getattr(err, 'problem', err)}"
        ) from None
    except RecursionError:  # PyYAML composes nodes recursively; a policy is ~5 levels deep
        raise PolicyError(
            "policy is nested too deeply to read (a policy is a few levels of mappings): "
            "give the policy file, not another"
        ) from None
    return parse_policy(data)


#: A policy is a few kilobytes (the Adult one, 6 KB): anything past this is the wrong file, and
#: reading it whole (``/dev/zero``, a data file) would exhaust memory.
MAX_POLICY_BYTES = 1_048_576


def load_policy(path: str | Path) -> Policy:
    p = Path(path)
    try:
        with p.open("rb") as fh:
            raw = fh.read(MAX_POLICY_BYTES + 1)
        if len(raw) > MAX_POLICY_BYTES:
            raise PolicyError(
                f"policy file {p} is larger than the {MAX_POLICY_BYTES // 1024} KiB a policy "
                "may take (a policy is a few KB of YAML): give the policy file, not another"
            )
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise PolicyError(f"policy file not found: {p}") from None
    except UnicodeDecodeError as err:  # the byte's offset, never the text around it
        raise PolicyError(
            f"policy file {p} is not UTF-8 text (byte {err.start + 1} cannot be read): save it "
            "as UTF-8"
        ) from None
    except OSError as err:
        raise PolicyError(f"cannot read policy file {p}: {err.__class__.__name__}") from None
    return policy_from_yaml(text)
