"""The agent's entry points: `python3 agent.pyz CONFIG` runs one attempt on this host, and
`python3 agent.pyz --pool CONFIG` a warm pool unit's long-lived agent.
"""

from __future__ import annotations

import http.client
import os
import sys
from collections.abc import Callable

from .attempt import Agent
from .attempt_key import fetch_attempt_key
from .basics import AGENT_CANNOT_START, AgentError, log
from .config import discover_identity, load_config, megascale_environment, read_tpu_env
from .megascale import key_with_slices
from .notices import watch_sigterm
from .pool import PoolAgent, load_pool_config
from .processes import become_subreaper
from .rest import (
    DEFAULT_METADATA_URL,
    PUBSUB_API,
    STORAGE_API,
    GoogleApi,
    Metadata,
    Publisher,
    SecretReader,
    Storage,
    TokenSource,
)


def pool_main(path: str) -> int:
    """`python3 agent.pyz --pool CONFIG`: the long-lived agent of one host of a pool unit."""
    early: list[str] = []  # a SIGTERM before the pool agent exists is acted on once it does
    target: list[Callable[[str], None]] = [early.append]
    watch_sigterm(lambda reason: target[-1](reason))
    if not become_subreaper():
        log("cannot become a child subreaper: a daemon a job double-forks may outlive the job")
    environ = dict(os.environ)
    metadata = Metadata(environ.get("TPUJOBS_METADATA_URL") or DEFAULT_METADATA_URL)
    try:
        config = load_pool_config(path)
        tpu_env = read_tpu_env(metadata)
        worker_id, slice_id = discover_identity(metadata, config, tpu_env)
    except (AgentError, OSError, http.client.HTTPException) as error:
        log(f"cannot start: {error}")
        return AGENT_CANNOT_START
    tokens = TokenSource(metadata)
    pubsub = GoogleApi.from_env("PUBSUB_EMULATOR_HOST", PUBSUB_API, environ, tokens)
    storage = Storage(GoogleApi.from_env("STORAGE_EMULATOR_HOST", STORAGE_API, environ, tokens))
    if pubsub.tokens is not None or storage.api.tokens is not None:
        try:
            tokens.token()  # fetched now, so a preemption notice never waits for it
        except (AgentError, OSError, http.client.HTTPException, ValueError, KeyError) as error:
            log(f"no access token yet: {error}")
    pool = PoolAgent(
        config,
        worker_id,
        slice_id,
        metadata,
        pubsub,
        storage,
        os.getcwd(),
        environ,
        echo=getattr(sys.stdout, "buffer", None),
        tokens=tokens,
        megascale=megascale_environment(tpu_env),
    )
    pool.prepull()
    target.append(pool.on_sigterm)
    if early:
        pool.on_sigterm(early[0])
    return pool.run()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--pool"] and len(args) == 2:
        return pool_main(args[1])
    if len(args) != 1 or args[0].startswith("--"):
        log("usage: python3 agent.pyz CONFIG_JSON, or python3 agent.pyz --pool POOL_CONFIG_JSON")
        return AGENT_CANNOT_START
    early: list[str] = []  # a SIGTERM before the agent exists is acted on once it does
    target: list[Callable[[str], None]] = [early.append]
    watch_sigterm(lambda reason: target[-1](reason))
    environ = dict(os.environ)
    metadata = Metadata(environ.get("TPUJOBS_METADATA_URL") or DEFAULT_METADATA_URL)
    try:
        config = load_config(args[0])
        tpu_env = read_tpu_env(metadata)
        worker_id, slice_id = discover_identity(metadata, config, tpu_env)
        key_url, job_id, attempt = str(config.get("key_url") or ""), config["job_id"], config["attempt"]
        key, megascale = key_with_slices(
            lambda address: fetch_attempt_key(metadata, key_url, job_id, attempt, slice_id, worker_id, address),
            metadata,
            config,
            slice_id,
            worker_id,
            megascale_environment(tpu_env),
        )
    except (AgentError, OSError, http.client.HTTPException) as error:
        log(f"cannot start: {error}")
        return AGENT_CANNOT_START
    config["env"] = dict(key.env)  # from the key's answer: no env value is in metadata
    tokens = TokenSource(metadata)
    publisher = Publisher(
        GoogleApi.from_env("PUBSUB_EMULATOR_HOST", PUBSUB_API, environ, tokens),
        config["project"],
        key.key,
        key.names(),
    )
    storage = Storage(GoogleApi.from_env("STORAGE_EMULATOR_HOST", STORAGE_API, environ, tokens))
    secret_reader = SecretReader(GoogleApi.secrets_from_env(environ, tokens), metadata)
    if publisher.api.tokens is not None or storage.api.tokens is not None:
        try:
            tokens.token()  # fetched now, so a preemption notice never waits for it
        except (AgentError, OSError, http.client.HTTPException, ValueError, KeyError) as error:
            log(f"no access token yet: {error}")
    workdir = os.getcwd()
    log(f"job {config['job_id']} attempt {config['attempt']}: slice {slice_id} worker {worker_id}, in {workdir}")
    echo = getattr(sys.stdout, "buffer", None)
    agent = Agent(
        config,
        worker_id,
        slice_id,
        metadata,
        publisher,
        storage,
        workdir,
        environ,
        echo=echo,
        secret_reader=secret_reader,
        tokens=tokens,
        megascale=megascale,
    )
    target.append(agent.preemption.trigger)
    if early:
        agent.preemption.trigger(early[0])
    return agent.run()
