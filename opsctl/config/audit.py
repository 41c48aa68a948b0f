"""The key audit: every key under `opsctl:` is a field of its model, at every level, or the
inventory is refused with the file:line that wrote it (a close name suggested, a removed key's
reason given), and a model's first error is reported at the line that set the value."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from opsctl.config.located import _where
from opsctl.config.models import HostSettings, Profile, WatchRules, WatchSettings
from opsctl.errors import ConfigError


# settings that map names to one model's fields
_KEYED: dict[tuple[type[BaseModel], str], type[BaseModel]] = {
    (HostSettings, "profiles"): Profile,
    (WatchSettings, "rules"): WatchRules,
}
# keys inventories used to accept that never acted: refused with the reason
_REMOVED: dict[tuple[str, ...], str] = {
    ("drafter", "name"): "nothing ever read it (the served name is opsctl.model.name); delete the line",
}
_SSH_FIX = ("SSH facts are Ansible's variables beside opsctl:, not under it (ansible_host, ansible_user, "
            "ansible_port, ansible_ssh_private_key_file); under opsctl: only ssh_known_hosts and ssh_strict_host_keys")


def _submodel(model: type[BaseModel], key: Any) -> type[BaseModel] | None:
    field = next((f for n, f in model.model_fields.items() if (f.alias or n) == key), None) \
        if isinstance(key, str) else None
    ann = field.annotation if field is not None else None
    if ann is not None and not isinstance(ann, type):  # `Model | None`: the model
        args = [a for a in getattr(ann, "__args__", ()) if a is not type(None)]
        ann = args[0] if len(args) == 1 else None
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def _settable(model: type[BaseModel]) -> list[str]:
    # a profile's name is its key under opsctl.profiles, never a setting; a field's YAML key is its alias
    return [f.alias or n for n, f in model.model_fields.items() if not (model is Profile and n == "name")]


def _check_keys(data: Any, model: type[BaseModel], path: tuple[str, ...], head: "_Head") -> None:
    """Every key of `data` (the settings for `model` at opsctl.<path>) is one of the
    model's fields, at every level; a mapping of the wrong type is left to the model."""
    if not isinstance(data, dict):
        return
    known = _settable(model)
    for key in data:
        if key not in known:
            raise _unknown_key(data, key, known, path, model, head)
    for key, value in data.items():
        sub = _submodel(model, key)
        if sub is not None:
            _check_keys(value, sub, (*path, key), head)
        elif (model, key) in _KEYED and isinstance(value, dict):
            for name, entry in value.items():
                _check_keys(entry, _KEYED[(model, key)], (*path, key, str(name)), head)


def _unknown_key(data: dict, key: Any, known: list[str], path: tuple[str, ...], model: type[BaseModel],
                 head: "_Head") -> ConfigError:
    import difflib

    dotted = ".".join(("opsctl", *path, str(key)))
    at = head.at(getattr(data, "where", {}).get(key))
    if (*path, str(key)) in _REMOVED:
        return ConfigError(f"{at}: {dotted} is not a setting (it never acted)", _REMOVED[(*path, str(key))])
    if model is Profile and key == "name":
        return ConfigError(f"{at}: {dotted}: a profile's name is its key under opsctl.profiles, not a setting",
                           "delete the name: line (rename the key to rename the profile)")
    close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
    problem = f"{at}: unknown key {dotted}" + (f": did you mean {close[0]!r}?" if close else "")
    if close:
        fix = f"rename it to {close[0]!r}"
    elif not path and (str(key) == "ssh" or str(key).startswith("ansible_")):
        fix = _SSH_FIX
    else:
        fix = f"{'.'.join(('opsctl', *path))} takes only: {', '.join(known)}"
    return ConfigError(problem, fix)


class _Head:
    """How a host's errors begin: `file:line: host NAME` where the line is known,
    else `DIR: host NAME`."""

    def __init__(self, directory: Path, host: str, data: Any):
        self.directory, self.host, self.data = directory, host, data

    def at(self, where: str | None) -> str:
        return f"{where or self.directory}: host {self.host}"

    def of(self, *loc: Any) -> str:
        return self.at(_where(self.data, loc))

    def invalid(self, exc: ValidationError, prefix: tuple, fix: str) -> ConfigError:
        """A model's first error under opsctl.<prefix>, at the line that set it."""
        err = exc.errors()[0]
        inner = getattr((err.get("ctx") or {}).get("error"), "loc", ())  # a _NestedError's own setting
        loc = (*prefix, *err["loc"])
        at = self.of(*loc, *inner)
        dotted = ".".join(str(p) for p in loc)
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            return ConfigError(f"{at}: opsctl: missing required setting {dotted}", fix)
        if _where(self.data, (*loc, *inner)) is not None:
            fix = "correct the value on that line"
        return ConfigError(f"{at}: opsctl.{dotted}: {msg}" if dotted else f"{at}: opsctl: {msg}", fix)
