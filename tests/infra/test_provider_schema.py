"""infra/ held against the Google provider's own schema, as `terraform validate` would hold it.

Every `resource` and `data` block: no argument or block the provider lacks (into nested and
dynamic blocks), every required argument and block set, a block the provider allows once given
at most once; meta-arguments allowed at the top. The
schema comes from @cdktf/provider-google, reduced and kept in tests/data (provider_schema.py).
"""

from __future__ import annotations

from typing import Any

import provider_schema
import pytest
from terraform_config import INFRA, Terraform, parse

# What Terraform itself reads in a resource or data block, whatever the provider.
META_ARGUMENTS = {"count", "for_each", "depends_on", "provider", "lifecycle"}
DYNAMIC_ARGUMENTS = {"for_each", "iterator", "labels", "content"}


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return provider_schema.load()


def problems(body: dict[str, Any], node: dict[str, Any], where: str, top: bool = True) -> list[str]:
    """What the provider would refuse in one block body, given its schema node."""
    found = []
    dynamic = {}
    for entry in body.get("dynamic", []):
        dynamic.update(entry)
    for key, value in body.items():
        if key == "dynamic" or (top and key in META_ARGUMENTS):
            continue
        if key in node["arguments"]:
            continue
        if key not in node["blocks"]:
            found.append(f"{where}: no argument or block {key!r}")
        elif not isinstance(value, list):
            found.append(f"{where}: {key!r} is a block, written as an argument")
        else:
            if node["blocks"][key]["single"] and len(value) + (key in dynamic) > 1:
                found.append(f"{where}: block {key!r} is allowed once")
            for nested in value:
                found += problems(nested, node["blocks"][key], f"{where}.{key}", top=False)
    for key, spec in dynamic.items():
        if key not in node["blocks"]:
            found.append(f"{where}: no block {key!r} (dynamic)")
            continue
        if extra := set(spec) - DYNAMIC_ARGUMENTS:
            found.append(f"{where}: dynamic {key!r} has {sorted(extra)}")
        for content in spec.get("content", []):
            found += problems(content, node["blocks"][key], f"{where}.{key}", top=False)
    for name, required in node["arguments"].items():
        if required and name not in body:
            found.append(f"{where}: required argument {name!r} is missing")
    for name, block in node["blocks"].items():
        if block["required"] and name not in body and name not in dynamic:
            found.append(f"{where}: required block {name!r} is missing")
    return found


def check(blocks: dict[tuple[str, str], dict[str, Any]], types: dict[str, Any], section: str) -> list[str]:
    found = []
    for (kind, name), body in sorted(blocks.items()):
        where = f"{section} {kind}.{name}"
        if kind not in types:
            found.append(f"{where}: the provider has no {section} type {kind!r}")
        else:
            found += problems(body, types[kind], where)
    return found


def test_every_resource_matches_the_provider(schema: dict[str, Any], tf: Terraform) -> None:
    """No unknown argument or block in any resource, and every required one set."""
    assert tf.resources
    assert check(tf.resources, schema["resource"], "resource") == []


def test_every_data_source_matches_the_provider(schema: dict[str, Any], tf: Terraform) -> None:
    """The same for data sources."""
    assert tf.data_sources
    assert check(tf.data_sources, schema["data"], "data") == []


def test_versions_pins_the_provider_the_schema_describes(schema: dict[str, Any]) -> None:
    """infra/ declares exactly the provider version the schema was generated from."""
    terraform = parse((INFRA / "versions.tf").read_text(encoding="utf-8"))["terraform"][0]
    google = terraform["required_providers"][0]["google"]
    assert schema["package"] == provider_schema.PACKAGE_VERSION
    assert google == {"source": "hashicorp/google", "version": schema["provider"]}


def test_the_check_finds_what_the_provider_would_refuse(schema: dict[str, Any]) -> None:
    """Unknown names, top and nested (also in dynamic blocks), missing required arguments of
    nested blocks and a single block given twice are reported; meta-arguments, repeated list
    blocks and a correct body are not."""
    text = """
    resource "google_pubsub_subscription" "bad" {
      topic        = "t"
      count        = 1
      no_such_flag = true
      push_config {
        push_endpoint = "https://x"
        oidc_token {
          audience = "a"
        }
      }
      retry_policy {}
      retry_policy {}
      dynamic "dead_letter_policy" {
        for_each = [1]
        content {
          dead_letter_topc = "d"
        }
      }
      dynamic "no_such_block" {
        for_each = []
        content {}
      }
    }
    resource "google_secret_manager_secret" "no_replication" {
      secret_id = "s"
    }
    resource "google_storage_bucket" "good" {
      name       = "b"
      location   = "US"
      depends_on = []
      lifecycle_rule {
        condition {
          age = 1
        }
        action {
          type = "Delete"
        }
      }
      lifecycle_rule {
        condition {
          days_since_noncurrent_time = 1
        }
        action {
          type = "Delete"
        }
      }
    }
    """
    parsed = parse(text)
    blocks = {
        (kind, name): body
        for block in parsed["resource"]
        for kind, named in block.items()
        for name, body in named.items()
    }
    assert sorted(check(blocks, schema["resource"], "resource")) == sorted(
        [
            "resource google_pubsub_subscription.bad: no argument or block 'no_such_flag'",
            "resource google_pubsub_subscription.bad: required argument 'name' is missing",
            "resource google_pubsub_subscription.bad.push_config.oidc_token: "
            "required argument 'service_account_email' is missing",
            "resource google_pubsub_subscription.bad.dead_letter_policy: no argument or block 'dead_letter_topc'",
            "resource google_pubsub_subscription.bad: no block 'no_such_block' (dynamic)",
            "resource google_pubsub_subscription.bad: block 'retry_policy' is allowed once",
            "resource google_secret_manager_secret.no_replication: required block 'replication' is missing",
        ]
    )
