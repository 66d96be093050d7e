"""Settings from environment variables, parsed and validated by pydantic-settings.

`Settings` declares each field once (type, default, why); the model here is built from it, so a
default is never written twice. A field is read from TPUJOBS_<FIELD>, save those in VARIABLES and
vm_defaults (TPUJOBS_DEFAULT_<FIELD>). Blanks around a value never count; empty means unset.
Imported only when settings are read: importing functions/main.py loads no pydantic.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from pydantic import Field, ValidationError, create_model
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from tpujobs.domain.vm_defaults import VmDefaults

# The fields whose variables are not TPUJOBS_<FIELD>; the first one set wins.
VARIABLES: dict[str, tuple[str, ...]] = {
    "project": ("GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT"),  # what Cloud Functions and gcloud set
    "api_audiences": ("TPUJOBS_API_AUDIENCE",),
}
VM_DEFAULTS = "TPUJOBS_DEFAULT_"  # vm_defaults: one variable per VmDefaults field
Built = TypeVar("Built")  # the Settings dataclass, passed in: this module is imported by it, never the reverse
_VM_HINTS = typing.get_type_hints(VmDefaults)


def read(settings: type[Built], environ: Mapping[str, str]) -> Built:
    """`settings` (the Settings dataclass) from `environ`; a bad value raises ValueError naming its
    variable and what it must be."""
    model = _model(settings)  # type: ignore[arg-type]  # a class is hashable; TypeVar hides it
    source = _Environ(model, environ)
    try:
        parsed = model(_build_sources=((source,), {}))  # BaseSettings' documented way to name its sources
    except ValidationError as error:
        raise ValueError(_complaint(error, environ, typing.get_type_hints(settings))) from None
    values = {name: getattr(parsed, name) for name in model.model_fields}
    if not values["logs_bucket"]:
        values["logs_bucket"] = f"{values['project']}-tpujobs-logs"  # the bucket infra/ makes
    return settings(**values)


@functools.cache
def _model(settings: type) -> type[BaseSettings]:
    """A pydantic-settings model with Settings' fields, types and defaults; an int is a count, at least 1."""
    hints = typing.get_type_hints(settings)
    fields: dict[str, Any] = {}
    for field in dataclasses.fields(settings):
        default = field.default_factory() if field.default is dataclasses.MISSING else field.default  # type: ignore[operator]
        hint = Annotated[int, Field(ge=1)] if hints[field.name] is int else hints[field.name]
        fields[field.name] = (hint, default)
    return create_model("SettingsFromEnv", __base__=BaseSettings, **fields)


class _Environ(PydanticBaseSettingsSource):
    """The variables of a given mapping (os.environ, or the one a test or the CLI passes), as text;
    comma lists split into tuples, vm_defaults gathered from its own variables."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.environ = environ

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        if field_name == "vm_defaults":
            disks = self._items(VM_DEFAULTS + "DATA_DISKS")
            values = {
                name: self._value(VM_DEFAULTS + name.upper(), annotation)
                for name, annotation in _VM_HINTS.items()
                if name != "data_disks"
            }
            if disks:
                values["data_disks"] = tuple(_disk(item) for item in disks)
            return {name: value for name, value in values.items() if value is not None}, field_name, True
        for variable in _variables(field_name):
            value = self._value(variable, field.annotation)
            if value is not None:
                return value, variable, False
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        values = {}
        for name, field in self.settings_cls.model_fields.items():
            value, _, _ = self.get_field_value(field, name)
            if value is not None:
                values[name] = value
        return values

    def _value(self, variable: str, annotation: Any) -> Any:
        """The variable's text (None when unset or blank); a comma list for a tuple."""
        if typing.get_origin(annotation) is tuple:
            return self._items(variable) or None
        text = (self.environ.get(variable) or "").strip()
        return text or None

    def _items(self, variable: str) -> tuple[str, ...]:
        return tuple(item.strip() for item in (self.environ.get(variable) or "").split(",") if item.strip())


def _variables(field_name: str) -> tuple[str, ...]:
    return VARIABLES.get(field_name, (f"TPUJOBS_{field_name.upper()}",))


def _disk(item: str) -> tuple[str, str]:
    """`source[:mode]`: a data disk is read-only unless it says otherwise."""
    source, _, mode = item.partition(":")
    return source, mode or "read-only"


def _complaint(error: ValidationError, environ: Mapping[str, str], hints: Mapping[str, Any]) -> str:
    """What today's operator needs: the variable, what it must be, and what it was."""
    first = error.errors()[0]
    location = [str(part) for part in first["loc"]]
    if location[0] == "vm_defaults":
        variable, annotation = VM_DEFAULTS + location[1].upper(), _VM_HINTS[location[1]]
    else:
        variable, annotation = _variables(location[0])[0], hints[location[0]]
        variable = next((name for name in _variables(location[0]) if environ.get(name)), variable)
    return f"{variable} must be {_expected(variable, annotation)}, got {environ.get(variable, '')!r}"


def _expected(variable: str, annotation: Any) -> str:
    if annotation is int:
        return "a whole number of days, at least 1" if variable.endswith("_DAYS") else "a whole number, at least 1"
    if annotation in (bool, bool | None):
        return "true or false"
    if annotation is float:
        return "a number"
    return "valid"
