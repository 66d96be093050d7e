"""The contract of `ports.UnitSecretRecords`: each warm-pool unit VM's secret hash, create-only."""

from __future__ import annotations

from datetime import timedelta

from contract_data import T0

A = "a" * 64
B = "b" * 64


def test_the_first_registered_hash_is_kept_and_refusals_are_counted(backend):
    """A second hash for the digest answers the first and changes nothing but its `refused` count;
    the same hash again answers itself; an unknown digest has none; no record expires."""
    store = backend.jobs
    assert store.unit_secret_sha256("u1") is None
    assert store.register_unit_secret("u1", A, "1001", T0) == A
    assert store.register_unit_secret("u1", B, "1001", T0 + timedelta(seconds=1)) == A
    assert store.register_unit_secret("u1", A, "1001", T0 + timedelta(seconds=2)) == A
    store.count_refused_unit_secret("u1", T0 + timedelta(seconds=1))
    store.count_refused_unit_secret("u1", T0 + timedelta(seconds=3))
    assert store.register_unit_secret("u2", B, "2002", T0) == B
    assert (store.unit_secret_sha256("u1"), store.unit_secret_sha256("u2")) == (A, B)
    record = store.unit_secret_document("u1")
    assert (record["secret_sha256"], record["instance_id"], record["registered_at"]) == (A, "1001", T0)
    assert record["refused"] == 2 and record["last_refused_at"] == T0 + timedelta(seconds=3)
    assert "expire_at" not in record
