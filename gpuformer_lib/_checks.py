"""Checks shared by the library's configs and size functions. Leaves out: everything a module checks once."""

from __future__ import annotations

import dataclasses
from typing import Any


def require_bools(**flags: Any) -> None:
    """Each flag is True or False: a string such as "no" or "False" would count as True, silently."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")


def require_bool_fields(instance: Any) -> None:
    """:func:`require_bools` on every field of a dataclass instance annotated ``bool``."""
    require_bools(**{field.name: getattr(instance, field.name) for field in dataclasses.fields(instance)
                     if field.type in ("bool", bool)})
