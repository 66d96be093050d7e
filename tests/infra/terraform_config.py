"""infra/*.tf as data: python-hcl2 with quotes stripped and blocks as lists.

Providers cannot be downloaded here, so `terraform validate` is out of reach: the infra tests
read the configuration as data and hold it against the code instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hcl2
from hcl2.utils import SerializationOptions

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
_OPTIONS = SerializationOptions(strip_string_quotes=True, explicit_blocks=False, with_comments=False)


@dataclass(frozen=True)
class Terraform:
    """Every block of infra/*.tf by kind: resources and data sources by (type, name), locals,
    variables, outputs."""

    resources: dict[tuple[str, str], dict[str, Any]]
    data_sources: dict[tuple[str, str], dict[str, Any]]
    locals: dict[str, Any]
    variables: dict[str, dict[str, Any]]
    outputs: dict[str, dict[str, Any]]
    text: str  # every file, for what the parser drops (comments)

    @classmethod
    def load(cls, directory: Path = INFRA) -> Terraform:
        resources: dict[tuple[str, str], dict[str, Any]] = {}
        data_sources: dict[tuple[str, str], dict[str, Any]] = {}
        local_values: dict[str, Any] = {}
        variables: dict[str, dict[str, Any]] = {}
        outputs: dict[str, dict[str, Any]] = {}
        texts = []
        for path in sorted(directory.glob("*.tf")):
            texts.append(path.read_text(encoding="utf-8"))
            with path.open(encoding="utf-8") as file:
                parsed = hcl2.load(file, serialization_options=_OPTIONS)
            for section, found in (("resource", resources), ("data", data_sources)):
                for block in parsed.get(section, []):
                    for kind, named in block.items():
                        for name, body in named.items():
                            assert (kind, name) not in found, f"{section} {kind}.{name} declared twice"
                            found[kind, name] = body
            for block in parsed.get("locals", []):
                for name, value in block.items():
                    assert name not in local_values, f"local.{name} declared twice"
                    local_values[name] = value
            for block in parsed.get("variable", []):
                variables.update(block)
            for block in parsed.get("output", []):
                outputs.update(block)
        return cls(resources, data_sources, local_values, variables, outputs, "\n".join(texts))

    def resource(self, kind: str, name: str) -> dict[str, Any]:
        assert (kind, name) in self.resources, f"infra/ declares no {kind}.{name}"
        return self.resources[kind, name]

    def of_kind(self, kind: str) -> dict[str, dict[str, Any]]:
        return {name: body for (k, name), body in self.resources.items() if k == kind}


def parse(text: str) -> dict[str, Any]:
    """HCL text as the infra tests read it: quotes stripped, blocks as lists."""
    return hcl2.loads(text, serialization_options=_OPTIONS)


def block(body: dict[str, Any], name: str) -> dict[str, Any]:
    """The one nested block `name` of a resource body (hcl2 gives blocks as lists)."""
    blocks = body.get(name)
    assert isinstance(blocks, list) and len(blocks) == 1, f"expected one {name} block, got {blocks!r}"
    return blocks[0]


def render(template: str, values: dict[str, str]) -> str:
    """A Terraform string template with the given `${expression}`s replaced by values."""
    for expression, value in values.items():
        template = template.replace("${" + expression + "}", value)
    assert "${" not in template, f"unexpected expression left in {template!r}"
    return template


def starts_with(expression: str) -> str:
    """The prefix of an IAM condition that is exactly `resource.name.startsWith("...")`."""
    match = re.fullmatch(r'resource\.name\.startsWith\("([^"]+)"\)', expression)
    assert match, f"expected one resource.name.startsWith condition, got {expression!r}"
    return match[1]


def secret_reader(tf: Terraform, grant: dict[str, Any], prefix: str, project_number: str) -> Callable[[str, str], bool]:
    """`readable(account_id, version_name)`: whether a secretAccessor grant keyed by job account (its
    condition on the project's secrets and the account's namespace) lets that account read that version."""
    values = {
        "local.project_secrets": render(
            tf.locals["project_secrets"], {"data.google_project.this.number": project_number}
        ),
        "local.job_secret_prefix": render(tf.locals["job_secret_prefix"], {"var.prefix": prefix}),
    }

    def readable(account_id: str, version_name: str) -> bool:
        expression = render(block(grant, "condition")["expression"], {**values, "each.key": account_id})
        return version_name.startswith(starts_with(expression))

    return readable
