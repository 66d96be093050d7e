"""Each job account's code under its own prefix of the code bucket: where the CLI uploads it,
and the submit refusal for a job pointed at another account's code."""

from __future__ import annotations

from typing import Any

import pytest

from tpujobs.domain import naming
from tpujobs.domain.spec import parse_spec
from tpujobs.engine.jobs.vetting import Vetting
from tpujobs.engine.settings import Settings

BUCKET = "proj-1-tpujobs-logs"
TEAM_A = "tpujobs-team-a@proj-1.iam.gserviceaccount.com"
TEAM_B = "tpujobs-team-b@proj-1.iam.gserviceaccount.com"
DIGEST = "ab" * 32
SETTINGS = Settings(
    project="proj-1",
    logs_bucket=BUCKET,
    tpu_service_account="tpujobs-tpu-vm@proj-1.iam.gserviceaccount.com",
    job_service_accounts=(TEAM_A, TEAM_B),
)


def a_spec(**changes: Any):
    data = {
        "job_id": "train-1",
        "name": "train",
        "owner": "alice@example.com",
        "accelerator_type": "v5litepod-8",
        "runtime_version": "v2-alpha-tpuv5-lite",
        "command": "python train.py",
        **changes,
    }
    return parse_spec(data, message_id=None)


def test_uploaded_code_is_named_under_the_prefix_of_the_account_the_job_runs_as() -> None:
    """code/jobs/ for the default account, code/accounts/{email}/ for an account of its own."""
    assert naming.code_object(DIGEST) == f"code/jobs/{DIGEST[:16]}.tar.gz"
    assert naming.code_object(DIGEST, TEAM_A) == f"code/accounts/{TEAM_A}/{DIGEST[:16]}.tar.gz"
    assert not naming.code_object(DIGEST, TEAM_A).startswith(naming.code_prefix(TEAM_B))
    assert not naming.code_object(DIGEST).startswith(naming.code_prefix(TEAM_A))


@pytest.mark.parametrize("account", ["Team@x.com", "a/b@x.com", "../x@y.com", "a@b/../c", "no-at-sign"])
def test_a_code_prefix_refuses_an_account_that_is_not_a_plain_email(account: str) -> None:
    """Only [a-z0-9.-] around one @: nothing that could climb out of or into another prefix."""
    with pytest.raises(ValueError, match="must be an email"):
        naming.code_prefix(account)


@pytest.mark.parametrize(
    ("code_uri", "account"),
    [
        (f"gs://{BUCKET}/code/accounts/{TEAM_B}/{DIGEST[:16]}.tar.gz", TEAM_A),
        (f"gs://{BUCKET}/code/jobs/{DIGEST[:16]}.tar.gz", TEAM_A),
        (f"gs://{BUCKET}/code/accounts/{TEAM_A}/{DIGEST[:16]}.tar.gz", None),
        (f"gs://{BUCKET}/code/{DIGEST[:16]}.tar.gz", None),  # the old shared naming
        (f"gs://{BUCKET}/code/accounts/{TEAM_A}/../{TEAM_B}/x.tar.gz", TEAM_A),
        (f"gs://{BUCKET}/code/jobs/", None),  # the whole prefix
    ],
)
def test_a_job_pointed_at_code_outside_its_accounts_prefix_is_refused_at_submit(
    code_uri: str, account: str | None
) -> None:
    """Vetting names the URI and the prefix it must be under; the job is not accepted."""
    spec = a_spec(code_uri=code_uri, **({"service_account": account} if account else {}))
    refusal = Vetting(SETTINGS).refusal(spec, owner_verified=True)
    assert refusal is not None
    assert code_uri in refusal
    assert f"not under gs://{BUCKET}/{naming.code_prefix(account)}" in refusal


@pytest.mark.parametrize(
    ("code_uri", "account"),
    [
        (f"gs://{BUCKET}/code/accounts/{TEAM_A}/{DIGEST[:16]}.tar.gz", TEAM_A),
        (f"gs://{BUCKET}/code/jobs/{DIGEST[:16]}.tar.gz", None),
        (f"gs://{BUCKET}/code/jobs/mine/", None),  # a prefix of its own account's
        ("gs://team-bucket/code/accounts/anyone/x.tar.gz", TEAM_A),  # another bucket: its IAM decides
        (f"gs://{BUCKET}-other/code/x.tar.gz", None),
    ],
)
def test_code_under_the_jobs_own_prefix_or_in_another_bucket_is_accepted(code_uri: str, account: str | None) -> None:
    """No refusal: the account's own code, or a bucket that is not the deployment's."""
    spec = a_spec(code_uri=code_uri, **({"service_account": account} if account else {}))
    assert Vetting(SETTINGS).refusal(spec, owner_verified=True) is None
