"""The naming rule of a job's secrets: NAME, NAME@VERSION or a full resource name."""

from __future__ import annotations

import pytest

from tpujobs.domain.secrets import (
    check_secret_name,
    check_secret_ref,
    namespace,
    parse_secret_id,
    secret_id,
    secret_version_name,
)

ACCOUNT = "tpujobs-tpu-vm@proj-1.iam.gserviceaccount.com"


def test_a_short_name_resolves_to_the_latest_version_in_the_accounts_namespace() -> None:
    """NAME -> projects/P/secrets/{prefix}tpujobs_{account id}_NAME/versions/latest."""
    assert (
        secret_version_name("hf-token", "proj-1", "", ACCOUNT)
        == "projects/proj-1/secrets/tpujobs_tpujobs-tpu-vm_hf-token/versions/latest"
    )


def test_the_prefix_starts_the_secret_id() -> None:
    """The deployment's topic prefix comes first, as Terraform's IAM condition expects."""
    assert (
        secret_version_name("W_AND_B", "proj-1", "t1-", ACCOUNT)
        == "projects/proj-1/secrets/t1-tpujobs_tpujobs-tpu-vm_W_AND_B/versions/latest"
    )


@pytest.mark.parametrize("version", ["1", "42", "latest"])
def test_name_at_version_names_that_version(version: str) -> None:
    """NAME@VERSION keeps the version, a positive number or latest."""
    assert secret_version_name(f"tok@{version}", "p", "", ACCOUNT).endswith(
        f"/secrets/tpujobs_tpujobs-tpu-vm_tok/versions/{version}"
    )


def test_a_full_secret_name_gets_the_latest_version() -> None:
    """projects/P/secrets/S passes through, in its own project, with /versions/latest added."""
    assert (
        secret_version_name("projects/other-proj/secrets/shared", "proj-1", "t1-", ACCOUNT)
        == "projects/other-proj/secrets/shared/versions/latest"
    )


def test_a_full_version_name_passes_through_unchanged() -> None:
    """projects/P/secrets/S/versions/V is used as given."""
    name = "projects/123456/secrets/shared_token/versions/3"
    assert secret_version_name(name, "proj-1", "", ACCOUNT) == name


@pytest.mark.parametrize(
    "ref",
    [
        "",
        "a" * 201,
        "has space",
        "dot.name",
        "tok@0",
        "tok@-1",
        "tok@01",
        "tok@newest",
        "tok@",
        "@1",
        "a@1@2",
        "projects/p/secrets/",
        "projects/p/secrets/s/versions/",
        "projects/p/secrets/s/versions/0",
        "projects/p/secrets/s/extra",
        "projects/P/secrets/s",
        "projects/p/secrets/" + "s" * 256,
        "tok\n",
    ],
)
def test_a_malformed_reference_is_refused_with_a_sentence(ref: str) -> None:
    """check_secret_ref raises ValueError naming what is wrong."""
    with pytest.raises(ValueError, match=r"secret|reference"):
        check_secret_ref(ref)


def test_a_bad_version_is_named_as_the_problem() -> None:
    """The sentence for NAME@bad speaks of the version, not the name."""
    with pytest.raises(ValueError, match="version after @"):
        check_secret_ref("tok@zero")


@pytest.mark.parametrize("ref", ["a", "A-b_c9", "x" * 200, "tok@7", "tok@latest", "projects/p-1/secrets/s_1"])
def test_a_wellformed_reference_passes(ref: str) -> None:
    """Every form the spec documents is accepted."""
    check_secret_ref(ref)


def test_secret_id_and_parse_secret_id_are_inverse() -> None:
    """The account id and NAME come back out of the id, even when NAME holds underscores."""
    made = secret_id("my_token_2", "t1-", ACCOUNT)
    assert made == "t1-tpujobs_tpujobs-tpu-vm_my_token_2"
    assert parse_secret_id(made, "t1-") == ("tpujobs-tpu-vm", "my_token_2")


@pytest.mark.parametrize("other", ["unrelated", "tpujobs_", "tpujobs_acct", "t2-tpujobs_a_b"])
def test_parse_secret_id_ignores_ids_outside_any_namespace(other: str) -> None:
    """Secrets that are not tpujobs' (or another deployment's) parse as None."""
    assert parse_secret_id(other, "t1-") is None


def test_namespace_is_what_every_id_of_the_account_starts_with() -> None:
    """The IAM prefix: {prefix}tpujobs_{account id}_."""
    assert namespace("", ACCOUNT) == "tpujobs_tpujobs-tpu-vm_"
    assert secret_id("x", "", ACCOUNT).startswith(namespace("", ACCOUNT))


@pytest.mark.parametrize("email", ["", "no-at-sign", "@proj.iam.gserviceaccount.com", "a@"])
def test_a_short_name_without_a_valid_account_is_refused(email: str) -> None:
    """No account, no namespace: a sentence, never a secret in nobody's namespace."""
    with pytest.raises(ValueError, match="service account email"):
        secret_version_name("tok", "p", "", email)


def test_a_prefix_that_cannot_start_a_secret_id_is_refused() -> None:
    """A topic prefix with a dot cannot appear in a secret id."""
    with pytest.raises(ValueError, match="prefix"):
        secret_id("tok", "team.a-", ACCOUNT)


def test_an_id_over_255_characters_is_refused() -> None:
    """A long prefix, account and NAME together may pass Secret Manager's limit: a sentence."""
    with pytest.raises(ValueError, match="255"):
        secret_id("n" * 200, "p" * 40, "a" * 30 + "@x.iam.gserviceaccount.com")


@pytest.mark.parametrize("name", ["tok@1", "projects/p/secrets/s", "", "a b"])
def test_check_secret_name_refuses_anything_but_a_bare_name(name: str) -> None:
    """`tpujobs secret set` takes NAME only."""
    with pytest.raises(ValueError, match="secret name"):
        check_secret_name(name)
