"""The Config reference, generated: `spot.Config`'s fields and each provider's settings, read
from the pydantic models' field descriptions, so the reference cannot drift from the code (there
is no hand-kept table). A field without a description fails the build (and
tests/test_docs.py, which calls `sections()` without Sphinx).

In a page:

    ```{spotnb-config} generic
    ```

with `generic` (the fields every provider takes) or a provider's name (`local`, `aws`, `azure`,
`gcp`, `any`): a table of field, default and description, each row an anchor `config-<field>`
that other pages link to."""

from __future__ import annotations

import enum
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

__all__ = ["Field", "MissingDescription", "sections", "fields_of", "setup"]


class MissingDescription(Exception):
    """A settings field has no `description=`: the reference would have a hole."""


@dataclass(frozen=True)
class Field:
    """One row of the reference."""

    name: str
    default: str
    description: str


def _models() -> dict[str, type[BaseModel]]:
    """The settings model of each built-in provider, by the name `Config(provider=...)` takes."""
    from spotnb.settings.any import AnySettings
    from spotnb.settings.aws import AWSSettings
    from spotnb.settings.azure import AzureSettings
    from spotnb.settings.gcp import GCPSettings
    from spotnb.settings.local import LocalSettings

    return {
        "local": LocalSettings,
        "aws": AWSSettings,
        "azure": AzureSettings,
        "gcp": GCPSettings,
        "any": AnySettings,
    }


def _default(info: Any) -> str:
    """The default as a reader would type it (a factory is called: `[]`, not `<list>`)."""
    if info.default_factory is not None:
        value = info.default_factory()
    elif info.default is PydanticUndefined:
        return "(required)"
    else:
        value = info.default
    if isinstance(value, enum.Enum):
        value = value.value
    return repr(value)


def fields_of(model: type[BaseModel], names: typing.Iterable[str]) -> list[Field]:
    """The rows of `names` (fields of `model`), in declaration order; raises MissingDescription
    naming every field whose description is missing or blank."""
    rows, missing = [], []
    for name in names:
        info = model.model_fields[name]
        text = (info.description or "").strip()
        if not text:
            missing.append(f"{model.__module__}.{model.__name__}.{name}")
        rows.append(Field(name, _default(info), text))
    if missing:
        raise MissingDescription(
            "settings fields without a description (give each Field(description=...)): " + ", ".join(missing)
        )
    return rows


def sections() -> dict[str, list[Field]]:
    """Every section of the reference: "generic" (`Config`'s own fields, every provider's), then
    each provider's settings. Together they are every field of `spot.Config`."""
    from spotnb.settings.config import Config

    models = _models()
    owned = {name for model in models.values() for name in model.model_fields}
    generic = [name for name in Config.model_fields if name not in owned]
    out = {"generic": fields_of(Config, generic)}
    for provider, model in models.items():
        out[provider] = fields_of(model, model.model_fields)
    return out


def setup(app: Any) -> dict[str, Any]:
    """Register the `spotnb-config` directive (Sphinx imports this module as an extension)."""
    from docutils import nodes
    from sphinx.errors import ExtensionError
    from sphinx.util.docutils import SphinxDirective

    class ConfigTable(SphinxDirective):
        """A table of one section's fields (see the module's docstring)."""

        required_arguments = 1

        def run(self) -> list[Any]:
            section = self.arguments[0]
            try:
                rows = sections()[section]
            except MissingDescription as e:
                raise ExtensionError(str(e)) from None
            except KeyError:
                raise self.error(f"spotnb-config: no section {section!r}") from None
            table = nodes.table(classes=["spotnb-config"])
            group = nodes.tgroup(cols=3)
            table += group
            for width in (22, 18, 60):
                group += nodes.colspec(colwidth=width)
            head = nodes.thead()
            group += head
            head += self._row([nodes.Text("field")], [nodes.Text("default")], [nodes.Text("meaning")])
            body = nodes.tbody()
            group += body
            for f in rows:
                row = self._row(
                    [nodes.literal(text=f.name)], [nodes.literal(text=f.default)], [nodes.Text(f.description)]
                )
                target = f"config-{f.name.replace('_', '-')}"
                row["ids"].append(target)
                body += row
            return [table]

        @staticmethod
        def _row(*cells: list[Any]) -> Any:
            row = nodes.row()
            for content in cells:
                entry = nodes.entry()
                para = nodes.paragraph()
                para.extend(content)
                entry += para
                row += entry
            return row

    app.add_directive("spotnb-config", ConfigTable)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
