"""Inventory YAML that remembers where each key was written (`file:line`), so an error about a
setting names the line that set it: the loader (yaml.SafeLoader with located mappings), the
lookup of a setting's line, and the reader's one-line errors."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from opsctl.errors import ConfigError


class _Located(dict):
    """A YAML mapping that remembers where each of its keys was written (`file:line`),
    so an error about a setting can name the line that set it."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.where: dict[Any, str] = {}


class _LineLoader(yaml.SafeLoader):
    source = "<yaml>"


def _construct_located(loader: _LineLoader, node: yaml.MappingNode):
    data = _Located()
    yield data
    data.update(loader.construct_mapping(node))
    for key_node, _ in node.value:  # merge keys (<<) are flattened in by now; the last one wins, as in the dict
        data.where[loader.construct_object(key_node)] = f"{loader.source}:{key_node.start_mark.line + 1}"


_LineLoader.add_constructor("tag:yaml.org,2002:map", _construct_located)


def _where(data: Any, loc: tuple) -> str | None:
    """`file:line` of the deepest key along `loc` that an inventory file wrote."""
    found, node = None, data
    for part in loc:
        if isinstance(node, dict) and part in node:
            found = getattr(node, "where", {}).get(part, found)
            node = node[part]
        elif isinstance(node, (list, tuple)) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            break
    return found


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", "check the path and its permissions") from None
    loader = _LineLoader(text)
    loader.source = str(path)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"malformed YAML at {where}: {problem}",
                          "fix the indentation/syntax on that line") from None
    finally:
        loader.dispose()


def _mapping(value: Any, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(value).__name__}",
                          "see inventories/lab/ for the expected layout")
    return value
