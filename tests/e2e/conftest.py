"""The local stacks of the end-to-end tests, on the run's emulators: one shared by every worker,
and one for the tests whose faults would reach every job on it (faults/conftest.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from support.e2e_stacks import ADMIN, PROJECT, clients_of, running_stack, submit


@pytest.fixture(scope="session")
def local_stack(emulators, pytestconfig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The stack the e2e tests share, its environment exported for the session. Tests on it run
    at once on several workers: each keeps to jobs, pools and owners of its own."""
    with running_stack(pytestconfig, tmp_path_factory.getbasetemp(), "shared", PROJECT, shared=True) as services:
        saved = dict(os.environ)
        os.environ.update(services)
        try:
            yield services
        finally:
            os.environ.clear()
            os.environ.update(saved)


@pytest.fixture(scope="session")
def env(local_stack):
    """Clients of the shared stack's services, and where things are, for the e2e tests."""
    return clients_of(local_stack)


@pytest.fixture(scope="session")
def stack_admin(local_stack) -> str:
    """The e-mail the stack's jobs API answers as an admin (TPUJOBS_ADMINS)."""
    return ADMIN


@pytest.fixture(scope="session")
def submit_job(env):
    """`submit_job(prefix=..., **spec)`: publish a job to the local stack, get its id."""
    return lambda prefix="e2e", **spec: submit(env, prefix, **spec)
