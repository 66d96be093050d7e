"""Trust between teams on the whole local stack: issue 11's "Done when", end to end.

A job's own code forges reports for another job (refused, recorded, nothing changes); a
secret reaches the command and nowhere else; another caller's describe shows no env value;
a job bigger than its pool's quota is refused at submit while the job behind it runs.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import shlex
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from stack_reads import worker_output

from tpujobs.domain.states import JobState
from tpujobs.engine import topology
from tpujobs.engine.api import CALLER_HEADER
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.e2e

OWNER = "ada@example.com"  # the owner tests/e2e/conftest.py submits as
STRANGER = "eve@example.com"
QUOTA_ZONE = "us-west4-a"  # a pool of this file's own: its quota holds back no other test

# Job A's command: standard library only, as any job's code could be. It reads its own
# attempt's key the way a job on a real VM could (the metadata server), then publishes to
# the Pub/Sub emulator's REST API, as the agent does: an unsigned `exited 0` for every
# worker of the victim, a preemption notice for the victim signed with A's own key, and a
# checkpoint for A itself with that key (believed: it shows the key was A's real one).
FORGER = r"""
import base64, datetime, hashlib, hmac, json, os, secrets, urllib.parse, urllib.request

direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def metadata_url():
    # On a real VM: http://metadata.google.internal. A simulated host names its metadata
    # server in the agent's environment only (the agent strips TPUJOBS_ variables from
    # the job's), and a process may read its ancestors' environments in /proc.
    pid = os.getpid()
    while pid > 1:
        with open("/proc/%d/environ" % pid, "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"TPUJOBS_METADATA_URL="):
                    return item.split(b"=", 1)[1].decode()
        with open("/proc/%d/stat" % pid) as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    raise SystemExit("forger: no metadata server among my ancestors")


def get(url):
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    return direct.open(request, timeout=10).read().decode()


def own_key():
    # What the agent does: trade this VM's identity token for the attempt's key.
    base, url = metadata_url(), os.environ["FORGE_KEY_URL"]
    query = urllib.parse.urlencode({"audience": url, "format": "full"})
    token = get(base + "/instance/service-accounts/default/identity?" + query)
    email = get(base + "/instance/service-accounts/default/email")
    body = json.dumps({"action": "attempt-key", "identity": token, "job_id": os.environ["TPUJOBS_JOB_ID"],
                       "attempt": int(os.environ["TPUJOBS_ATTEMPT"]), "slice_id": 0,
                       "worker_id": int(os.environ["TPUJOBS_WORKER_ID"])}).encode()
    headers = {"Content-Type": "application/json", "X-Tpujobs-Caller": email}
    answer = json.load(direct.open(urllib.request.Request(url, body, headers), timeout=10))
    text = answer["key"].split(":", 1)[1]  # tpujobs-key-v1:BASE64URL
    names = {"tpujobs-key-version": answer["key_version"], "tpujobs-job-created": answer["job_created"]}
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)), names


def publish(topic, payload, key=None):
    at = datetime.datetime.now(datetime.timezone.utc).isoformat()
    data = json.dumps(dict(payload, at=at, nonce=secrets.token_hex(16))).encode()
    message = {"data": base64.b64encode(data).decode()}
    if key is not None:
        signature = "v1=" + hmac.new(key[0], data, hashlib.sha256).hexdigest()
        message["attributes"] = {"tpujobs-signature": signature, **key[1]}
    url = "http://%s/v1/projects/%s/topics/%s:publish" % (
        os.environ["PUBSUB_EMULATOR_HOST"], os.environ["FORGE_PROJECT"], topic
    )
    body = json.dumps({"messages": [message]}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    ids = json.load(direct.open(request, timeout=10))["messageIds"]
    print("forger: published to", topic, "as message", ids[0], flush=True)


key = own_key()
me, victim = os.environ["TPUJOBS_JOB_ID"], os.environ["FORGE_VICTIM"]
events, preemption = os.environ["FORGE_EVENTS_TOPIC"], os.environ["FORGE_PREEMPTION_TOPIC"]
for worker in range(int(os.environ["FORGE_VICTIM_WORKERS"])):
    exited = {"kind": "exited", "job_id": victim, "attempt": 1, "slice_id": 0,
              "worker_id": worker, "exit_code": 0}
    publish(events, exited)
notice = {"job_id": victim, "attempt": 1, "slice_id": 0, "worker_id": 0, "reason": "forged"}
publish(preemption, notice, key)
mine = {"kind": "checkpoint", "job_id": me, "attempt": int(os.environ["TPUJOBS_ATTEMPT"]),
        "slice_id": 0, "worker_id": 0, "step": 777}
publish(events, mine, key)
print("forger: done", flush=True)
"""


@pytest.fixture(scope="module")
def http() -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # loopback: never through a proxy from the environment
    return session


def post(http: requests.Session, body: dict, caller: str) -> requests.Response:
    return http.post(os.environ["TPUJOBS_API_URL"], json=body, headers={CALLER_HEADER: caller}, timeout=30)


def cli(*args: str, input: str | None = None) -> str:
    from typer.testing import CliRunner

    from tpujobs.cli import app

    result = CliRunner().invoke(app, list(args), input=input)
    assert result.exit_code == 0, result.output
    return result.output


def submit_with(env, prefix: str, spec: dict) -> str:
    """As conftest's `submit_job`, for specs with an `env` field (which its keywords cannot take)."""
    from tpujobs.engine.topology import SUBMIT

    job_id = f"{prefix}-{uuid.uuid4().hex[:6]}"
    payload = {"job_id": job_id, "name": "e2e", "owner": OWNER, "capacity": "spot", **spec}
    env["publisher"].publish_json(SUBMIT, payload)
    return job_id


def state_of(env, job_id: str, wanted: JobState, timeout: float = 60):
    def probe():
        job = env["store"].get(job_id)
        return job if job is not None and job.state is wanted else None

    probe.__doc__ = f"{job_id} {wanted.value}"
    return wait_for(probe, timeout=timeout)


def ended(env, job_id: str, timeout: float = 60):
    def probe():
        job = env["store"].get(job_id)
        return job if job is not None and job.state.is_terminal else None

    probe.__doc__ = f"{job_id} to end"
    return wait_for(probe, timeout=timeout)


def cancel(http: requests.Session, *job_ids: str) -> None:
    """Cancel as the owner; a job that already ended is left as it is."""
    for job_id in job_ids:
        answer = post(http, {"action": "cancel", "job_id": job_id}, OWNER)
        assert answer.status_code in (200, 409), answer.text


def rejections_about(env, job_id: str) -> list:
    return [r for r in env["store"].rejections(limit=1000) if f'"{job_id}"' in r.payload]


def alive_workers(env, queued_resource: str) -> list[dict]:
    return [w for w in env["control"].workers(env["zone"], queued_resource) if w["alive"]]


# -- 1. forged reports ---------------------------------------------------------------------


def test_a_jobs_forged_exit_and_preemption_for_another_running_job_change_nothing_and_are_rejected(
    env, submit_job, http
):
    """Job A publishes an unsigned `exited 0` for each worker of B and a preemption notice for
    B signed with A's own key: B stays RUNNING at attempt 1 with no restart, its hosts keep
    running, and `rejections` holds the first of each kind with its reason; A's own report is believed."""
    prefix = os.environ.get("TPUJOBS_PREFIX", "")
    events_topic = topology.topic_name(topology.WORKER_EVENTS, prefix)
    preemption_topic = topology.topic_name(topology.PREEMPTION, prefix)
    victim = submit_job(prefix="victim", command='while true; do echo "victim $TPUJOBS_WORKER_ID"; sleep 1; done')
    forger = None
    try:
        running = state_of(env, victim, JobState.RUNNING)
        wait_for(lambda: len(alive_workers(env, running.queued_resource)) == 2)
        forger = submit_with(
            env,
            "forger",
            {
                "accelerator_type": "v4-8",
                "command": f"python3 -c {shlex.quote(FORGER)} && sleep 600",
                "env": {
                    "FORGE_VICTIM": victim,
                    "FORGE_VICTIM_WORKERS": str(running.spec.hosts_per_slice),
                    "FORGE_PROJECT": env["project"],
                    "FORGE_EVENTS_TOPIC": events_topic,
                    "FORGE_PREEMPTION_TOPIC": preemption_topic,
                    "FORGE_KEY_URL": os.environ["TPUJOBS_KEY_URL"],
                },
            },
        )

        def two_rejections():
            """the first forged exit of the victim (the second is counted, not recorded: a flood
            costs no write each) and the forged preemption, in rejections"""
            found = rejections_about(env, victim)
            if len(found) < 2:
                job = env["store"].get(forger)
                assert job is None or not job.state.is_terminal, (
                    job.state_reason,
                    worker_output(env, forger),
                )
                return None
            return found

        rejected = wait_for(two_rejections, timeout=60)
        by_topic = {
            topic: [r for r in rejected if r.topic.endswith(topic)] for topic in (events_topic, preemption_topic)
        }
        assert len(by_topic[events_topic]) == 1 and len(by_topic[preemption_topic]) == 1, rejected
        (forged_exit,) = by_topic[events_topic]
        assert '"exited"' in forged_exit.payload
        assert forged_exit.reason.startswith(f"Report for {victim} attempt 1 refused")
        assert "unsigned" in forged_exit.reason, forged_exit.reason
        (forged_notice,) = by_topic[preemption_topic]
        assert "not signed by the key it names" in forged_notice.reason, forged_notice.reason

        # A's key was its real one: the checkpoint it signed for itself was believed.
        def own_checkpoint():
            """the forger's self-signed checkpoint 777 recorded"""
            return any(w.get("checkpoint_step") == 777 for w in env["store"].workers(forger))

        wait_for(own_checkpoint, timeout=30)
        wait_for(lambda: "forger: done" in worker_output(env, forger), timeout=30)  # chunks ship every 2 s

        until = time.monotonic() + 5  # several seconds after both forgeries were handled
        while time.monotonic() < until:
            job = env["store"].get(victim)
            assert (job.state, job.attempt, job.restarts) == (JobState.RUNNING, 1, 0), job.state_reason
            time.sleep(0.25)
        assert len(alive_workers(env, running.queued_resource)) == 2
        timeline = [e.to_state for e in env["store"].events(victim)]
        assert timeline[-1] is JobState.RUNNING and JobState.RECOVERING not in timeline, timeline
        assert not any(w.get("exit_code") is not None for w in env["store"].workers(victim))
    finally:
        cancel(http, *[job_id for job_id in (victim, forger) if job_id])
    assert env["store"].get(victim).state is JobState.CANCELLED


# -- 2. secrets ----------------------------------------------------------------------------


@pytest.fixture
def taps(env) -> Iterator:
    """A pull subscription on every tpujobs topic, made before the test submits anything;
    `taps()` drains them and returns every message heard so far, as (topic, message)."""
    from google.api_core import exceptions
    from google.cloud import pubsub_v1

    subscriber = pubsub_v1.SubscriberClient()
    prefix = os.environ.get("TPUJOBS_PREFIX", "")
    tag = uuid.uuid4().hex[:6]
    subscriptions = {}
    for base in topology.ALL_TOPICS:
        name = subscriber.subscription_path(env["project"], f"trust-tap-{tag}-{base}")
        topic = subscriber.topic_path(env["project"], topology.topic_name(base, prefix))
        subscriber.create_subscription(request={"name": name, "topic": topic})
        subscriptions[base] = name
    heard: list = []

    def drain() -> list:
        for base, name in subscriptions.items():
            while True:
                try:
                    answer = subscriber.pull(
                        request={
                            "subscription": name,
                            "max_messages": 500,
                            "return_immediately": True,
                        },
                        timeout=10,
                    )
                except exceptions.DeadlineExceeded:
                    break
                if not answer.received_messages:
                    break
                heard.extend((base, m.message) for m in answer.received_messages)
                subscriber.acknowledge(
                    request={
                        "subscription": name,
                        "ack_ids": [m.ack_id for m in answer.received_messages],
                    }
                )
        return heard

    yield drain
    for name in subscriptions.values():
        subscriber.delete_subscription(request={"subscription": name})
    subscriber.close()


def firestore_documents(project: str) -> dict[str, str]:
    """Every document of the project's database, every collection and subcollection: path -> text."""
    from google.cloud import firestore

    found: dict[str, str] = {}

    def walk(collection) -> None:
        for document in collection.stream():
            found[document.reference.path] = repr(document.to_dict())
        for reference in collection.list_documents():
            for subcollection in reference.collections():
                walk(subcollection)

    for collection in firestore.Client(project=project).collections():
        walk(collection)
    return found


# `taps` pulls with return_immediately, deprecated but what lets a drain of nine empty
# subscriptions on the emulator end at once instead of waiting out a deadline on each.
@pytest.mark.filterwarnings("ignore:The return_immediately flag is deprecated:DeprecationWarning")
def test_a_secret_reaches_the_command_and_no_document_message_log_or_api_answer(env, submit_job, http, taps):
    """`tpujobs secret set hf-token`, then a job with secrets {HF_TOKEN: hf-token} prints the
    value's SHA-256: it SUCCEEDS with the digest in its exported logs, and the value (or its
    base64) is in no Firestore document, no message on any topic, no file of the stack's state
    directory (the functions' logs among them), no queued resource and no API answer."""
    value = "hf_" + secrets.token_urlsafe(32)
    needles = (value, base64.b64encode(value.encode()).decode())
    created = cli("secret", "set", "hf-token", input=value + "\n")
    assert "hf-token" in created and value not in created
    job_id = submit_job(
        prefix="secret",
        accelerator_type="v4-8",
        secrets={"HF_TOKEN": "hf-token"},
        command="printf '%s' \"$HF_TOKEN\" | sha256sum; sleep 3",
    )
    running = state_of(env, job_id, JobState.RUNNING)
    qr_name = f"projects/{env['project']}/locations/{running.zone}/queuedResources/{running.queued_resource}"
    request = env["tpu"].get_queued_resource(name=qr_name)
    script = request.tpu.node_spec[0].node.metadata["startup-script"]
    config = json.loads(base64.b64decode(script.split("<<'TPUJOBS_CONFIG_EOF'\n")[1].split("TPUJOBS_CONFIG_EOF")[0]))
    assert config["secrets"]["HF_TOKEN"].endswith("_hf-token/versions/latest"), config["secrets"]
    queued_resource = str(request) + json.dumps(config)  # the request, metadata and agent config

    job = ended(env, job_id)
    assert job.state is JobState.SUCCEEDED, job.state_reason
    digest = hashlib.sha256(value.encode()).hexdigest()
    wait_for(lambda: env["store"].attempt_logs(job_id, 1), timeout=60)
    attempt_log = (
        env["storage"].bucket(env["bucket"]).blob(f"logs/jobs/{job_id}/attempt-1/attempt.log").download_as_text()
    )
    assert f"{digest}  -" in attempt_log
    shown_logs = cli("logs", job_id)
    assert digest in shown_logs

    def announced_end():
        """the job's SUCCEEDED on tpujobs-status"""
        return any(
            base == topology.STATUS
            and m.attributes.get("job_id") == job_id
            and m.attributes.get("to_state") == "SUCCEEDED"
            for base, m in taps()
        )

    wait_for(announced_end, timeout=30)
    messages = taps()
    assert any(base == topology.WORKER_EVENTS and job_id.encode() in m.data for base, m in messages)

    documents = firestore_documents(env["project"])
    for part in ("events", "workers", "attempts"):
        assert any(path.startswith(f"jobs/{job_id}/{part}/") for path in documents), part
    state_dir = Path(os.environ["TPUJOBS_STATE_DIR"])
    files = {path: path.read_bytes() for path in state_dir.rglob("*") if path.is_file()}
    assert any(path.name.startswith("function-") for path in files)
    objects = {  # the job's logs and checkpoints
        b.name: b.download_as_bytes()
        for prefix in (f"logs/jobs/{job_id}/", f"checkpoints/jobs/{job_id}/")
        for b in env["storage"].list_blobs(env["bucket"], prefix=prefix)
    }
    listed = post(http, {"action": "list", "owner": OWNER, "limit": 1000}, OWNER)
    described = post(http, {"action": "describe", "job_id": job_id}, OWNER)
    assert listed.status_code == described.status_code == 200
    assert job_id in listed.text and described.json()["job"]["spec"]["secrets"] == {"HF_TOKEN": "hf-token"}

    for needle in needles:
        assert [path for path, text in documents.items() if needle in text] == []
        assert [
            (base, m.message_id) for base, m in messages if needle.encode() in m.data + repr(m.attributes).encode()
        ] == []
        assert [str(path) for path, data in files.items() if needle.encode() in data] == []
        assert [name for name, data in objects.items() if needle.encode() in data] == []
        assert needle not in queued_resource
        assert needle not in listed.text and needle not in described.text
        assert needle not in shown_logs


def test_a_job_whose_secret_does_not_exist_fails_once_naming_the_secret_and_the_account(env, submit_job):
    """secrets {HF_TOKEN: a name nobody set}: FAILED at attempt 1 with no restart, and the reason
    names the secret and the account the VMs run as."""
    missing = f"nobody-set-{uuid.uuid4().hex[:6]}"
    job_id = submit_job(
        prefix="nosecret",
        accelerator_type="v4-8",
        secrets={"HF_TOKEN": missing},
        command="echo never runs",
    )
    job = ended(env, job_id)
    assert job.state is JobState.FAILED, job.state_reason
    assert (job.attempt, job.restarts) == (1, 0)
    account = os.environ["TPUJOBS_TPU_SERVICE_ACCOUNT"]
    assert missing in job.state_reason and account in job.state_reason, job.state_reason
    assert JobState.RECOVERING not in [e.to_state for e in env["store"].events(job_id)]
    assert "never runs" not in worker_output(env, job_id)


# -- 3. env values -------------------------------------------------------------------------


def test_describe_by_another_caller_shows_env_names_and_no_values(env, submit_job, http):
    """env {LEARNING_RATE: <a value found nowhere else>}: through the jobs API a stranger sees
    the name and not the value anywhere in describe or list; the owner sees the value. (A plain
    number such as 0.123 could turn up in another job's chip-hours and prove nothing.)"""
    value = f"0.123-{uuid.uuid4().hex}"
    job_id = submit_with(
        env,
        "env",
        {"accelerator_type": "v4-8", "env": {"LEARNING_RATE": value}, "command": "sleep 600"},
    )
    try:
        wait_for(lambda: env["store"].get(job_id))
        stranger = post(http, {"action": "describe", "job_id": job_id}, STRANGER)
        assert stranger.status_code == 200, stranger.text
        assert "LEARNING_RATE" in stranger.json()["job"]["spec"]["env"]
        assert value not in stranger.text
        listed = post(http, {"action": "list", "owner": OWNER, "limit": 1000}, STRANGER)
        assert listed.status_code == 200 and job_id in listed.text
        assert value not in listed.text
        owner = post(http, {"action": "describe", "job_id": job_id}, OWNER)
        assert owner.json()["job"]["spec"]["env"] == {"LEARNING_RATE": value}
    finally:
        cancel(http, job_id)


# -- 4. quota ------------------------------------------------------------------------------


@pytest.fixture
def small_v4_quota(env) -> Iterator[str]:
    """`tpujobs quota set` 8 Spot chips of v4 (the tier of conftest's jobs) in a zone of this
    file's own; unset afterwards."""
    from google.cloud import firestore

    from tpujobs.adapters.firestore_pools import FirestorePools

    cli("quota", "set", QUOTA_ZONE, "v4", "8", "--tier", "spot")
    yield QUOTA_ZONE
    FirestorePools(firestore.Client(project=env["project"])).set_quota(QUOTA_ZONE, "v4", "spot", None)


def test_an_oversized_job_is_refused_at_submit_and_the_job_behind_it_runs(env, submit_job, http, small_v4_quota):
    """Quota 8 chips of v4: a v4-32 (16 chips) is refused with a sentence in rejections and
    never stored; a v4-16 (8 chips) submitted right behind it reaches RUNNING."""
    oversized = submit_job(prefix="huge", accelerator_type="v4-32", zone=small_v4_quota, command="sleep 600")
    fitting = submit_job(prefix="fits", accelerator_type="v4-16", zone=small_v4_quota, command="sleep 600")
    try:
        running = state_of(env, fitting, JobState.RUNNING)
        assert running.attempt == 1 and running.zone == small_v4_quota
        (refused,) = wait_for(lambda: rejections_about(env, oversized), timeout=30)
        assert refused.reason.startswith(f"job {oversized!r}"), refused.reason
        assert "asks for 16 chips" in refused.reason, refused.reason
        assert f"the quota of v4 spot chips in {small_v4_quota} (8)" in refused.reason, refused.reason
        assert "ask an admin to raise the quota" in refused.reason, refused.reason
        assert env["store"].get(oversized) is None
    finally:
        cancel(http, fitting)
