"""The end-to-end tests whose faults, counts or teams would reach every job on the shared stack: a
stack of their own, in a project of its own, on the one worker their xdist group ("e2e-faults", which each
file here names) goes to. Here
`local_stack`, `env` and `submit_job` are that stack's, its environment exported for each test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from unittest import mock

import pytest

from support.e2e_stacks import ADMIN, clients_of, running_stack, submit

PROJECT = "tpujobs-e2e-faults"  # apart from the shared stack's on the run's emulators


@pytest.fixture(scope="session")
def faults_stack(emulators, pytestconfig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    with running_stack(pytestconfig, tmp_path_factory.getbasetemp(), "faults", PROJECT, shared=False) as services:
        yield services


@pytest.fixture(scope="session")
def faults_clients(faults_stack: dict[str, str]) -> dict:
    with mock.patch.dict(os.environ, faults_stack):  # the clients read their emulators' addresses
        return clients_of(faults_stack)


@pytest.fixture
def local_stack(faults_stack: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This directory's stack, its environment exported while the test runs (`tpujobs dev` reads it)."""
    for name, value in faults_stack.items():
        monkeypatch.setenv(name, value)
    return faults_stack


@pytest.fixture
def env(local_stack: dict[str, str], faults_clients: dict) -> dict:
    return faults_clients


@pytest.fixture
def submit_job(env: dict):
    """`submit_job(prefix=..., **spec)`: publish a job to this directory's stack, get its id."""
    return lambda prefix="e2e", **spec: submit(env, prefix, **spec)


@pytest.fixture(scope="session")
def stack_admin(faults_stack: dict[str, str]) -> str:
    """The e-mail this stack's jobs API answers as an admin (TPUJOBS_ADMINS)."""
    return ADMIN
