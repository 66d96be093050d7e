"""Issue 37 item 2: a VM asks for its key and nothing else.

A token minted for the key URL (what a job's code can get from its VM's metadata server) is
refused by the `jobs` API with 403 for every action, signed or with the signature Cloud Run
removed; the `attempt_key` function (`KeyApi`) answers that action alone, for a token of its own
URL. The verifier is a stand-in that accepts a token whose `aud` is among the audiences asked
(google-auth's own checks are tests/unit/engine/test_api_identity.py).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from tpujobs.engine.api import JobsApi
from tpujobs.engine.identity import InvalidToken
from tpujobs.engine.key_api import KeyApi
from tpujobs.engine.settings import Settings
from tpujobs.local.fakes import InMemoryJobStore

API_URL = "https://us-central1-p.cloudfunctions.net/tpujobs-jobs"
KEY_URL = "https://us-central1-p.cloudfunctions.net/tpujobs-attempt-key"
VM = "tpujobs-tpu-vm@p.iam.gserviceaccount.com"
ACTIONS = [
    {"action": "list"},
    {"action": "describe", "job_id": "train-1"},
    {"action": "cancel", "job_id": "train-1"},
    {"action": "rerun", "job_id": "train-1"},
    {"action": "logs", "job_id": "train-1"},
    {"action": "pool-list"},
    {"action": "submit", "name": "x", "accelerator_type": "v4-8", "command": "true"},
    {"action": "attempt-key", "identity": "t", "job_id": "train-1", "attempt": 1, "slice_id": 0, "worker_id": 0},
]


def jwt(aud: str | list[str], email: str = VM, signature: str = "c2ln") -> str:
    """A token shaped as Google's, with these claims (`signature` "" : as Cloud Run leaves it)."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    claims = {"aud": aud, "email": email, "email_verified": True, "iss": "https://accounts.google.com"}
    claims["exp"] = int(time.time()) + 600
    head = f"{part({'alg': 'RS256'})}.{part(claims)}"
    return f"{head}.{signature}" if signature else head


def verifier(token: str, audiences: Sequence[str]) -> dict[str, Any]:
    """Accepts any token whose `aud` is among `audiences` (its signature taken as good)."""
    payload = token.split(".")[1]
    claims: dict[str, Any] = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    aud = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
    if not set(aud) & set(audiences):
        raise InvalidToken("wrong audience")
    return claims


class NoJobs:
    """A job store with no jobs: every action answers without one."""

    def get(self, job_id: str) -> None:
        return None

    def list_jobs(self, **_: Any) -> list[Any]:
        return []


def jobs_api(**settings: Any) -> JobsApi:
    configured = Settings(project="p", key_url=KEY_URL, **settings)
    service = SimpleNamespace(settings=configured, warm=None, access=None, clock=time.time)
    return JobsApi(service, NoJobs(), configured, verify_token=verifier)  # type: ignore[arg-type]


def post(app: Any, url: str, body: dict[str, Any], token: str) -> Any:
    return app.handle("POST", url, {"Authorization": f"Bearer {token}"}, json.dumps(body).encode())


@pytest.mark.parametrize("body", ACTIONS, ids=[b["action"] for b in ACTIONS])
def test_the_jobs_api_refuses_a_token_for_the_key_url_for_every_action(body):
    """A signed token whose audience is the key URL is a 403 saying so, whatever the action."""
    answer = post(jobs_api(), API_URL, body, jwt(KEY_URL))
    assert answer.status == 403, answer.body
    assert "key URL" in answer.body["error"]


def test_the_jobs_api_refuses_it_when_cloud_run_removed_its_signature():
    """With platform auth (Cloud Run checked the token), a key-URL token is still a 403."""
    app = jobs_api(api_platform_auth=True)
    assert post(app, API_URL, {"action": "list"}, jwt(KEY_URL, signature="")).status == 403
    assert post(app, API_URL, {"action": "list"}, jwt(API_URL, signature="")).status == 200


def test_the_jobs_api_refuses_a_token_naming_the_key_url_among_others():
    """An audience list that holds the key URL (with or without a trailing slash) is refused too."""
    assert post(jobs_api(), API_URL, {"action": "list"}, jwt([API_URL, KEY_URL + "/"])).status == 403


def test_the_jobs_api_still_answers_a_token_for_its_own_url():
    """A user's token for the API's URL lists jobs; the key URL is not among the audiences accepted."""
    app = jobs_api()
    assert post(app, API_URL, {"action": "list"}, jwt(API_URL, email="ada@example.com")).status == 200
    assert KEY_URL not in app.audiences(API_URL)
    assert KEY_URL not in jobs_api(api_audiences=(API_URL, KEY_URL)).audiences(API_URL)


def test_the_jobs_api_no_longer_hands_out_keys():
    """`attempt-key` at the jobs API is a 404 pointing at the key URL, for a caller it admits."""
    body = ACTIONS[-1]
    answer = post(jobs_api(), API_URL, body, jwt(API_URL, email="ada@example.com"))
    assert answer.status == 404 and "TPUJOBS_KEY_URL" in answer.body["error"]


def key_api(**settings: Any) -> KeyApi:
    configured = Settings(project="p", key_url=KEY_URL, tpu_service_account=VM, **settings)
    return KeyApi(InMemoryJobStore(), configured, time.time, verify_vm_token=verifier, verify_token=verifier)


def test_the_key_function_answers_attempt_key_alone():
    """Any other action at the key URL is a 404: a VM's token buys its key and nothing else."""
    for body in ACTIONS[:-1]:
        answer = post(key_api(), KEY_URL, body, jwt(KEY_URL))
        assert answer.status == 404, (body, answer.body)


def test_the_key_function_takes_only_tokens_for_the_key_url():
    """A token for the jobs API's URL is a 401 at the key URL; one for the key URL reaches the
    grant (here: no such job, 403)."""
    body = {**ACTIONS[-1], "identity": jwt(KEY_URL)}
    assert post(key_api(), KEY_URL, body, jwt(API_URL)).status == 401
    answer = post(key_api(), KEY_URL, body, jwt(KEY_URL))
    assert answer.status == 403 and "no such job" in answer.body["error"]
