"""`tpujobs quota show|set|unset|set-reservation|unset-reservation` on the Firestore emulator:
what `config/quotas` then holds, and what admission then reads."""

from __future__ import annotations

import functools
import json

import pytest

from tpujobs.adapters.firestore_pools import FirestorePools
from tpujobs.domain.admission import Holder
from tpujobs.domain.quotas import PoolKey
from tpujobs.local.testing import config_document

pytestmark = pytest.mark.emulator


@pytest.fixture
def run(cli_without_api):
    return functools.partial(cli_without_api, "quota")


def stored(firestore_client) -> dict:
    return config_document(firestore_client, "quotas")


def test_each_tier_and_a_reservation_are_set_shown_and_unset(run, firestore_client):
    """Each tier of a family is a map entry; a region and a reservation are limits of their own;
    admission's book reads each."""
    assert "No quotas" in run("show").output

    assert run("set", "us-east5-a", "v5p", "64").exit_code == 0
    assert stored(firestore_client) == {"us-east5-a": {"v5p": {"on-demand": 64}}}
    result = run("set", "us-east5-a", "v5p", "256", "--tier", "spot")
    assert result.exit_code == 0, result.output
    assert "v5p spot chips in us-east5-a: 256" in result.output
    assert run("set", "us-east5", "v5p", "512", "--tier", "spot").exit_code == 0
    assert run("set", "us-east5-b", "v5p", "32", "--tier", "reserved").exit_code == 0
    assert run("set-reservation", "team-a", "128").exit_code == 0
    assert stored(firestore_client) == {
        "us-east5-a": {"v5p": {"on-demand": 64, "spot": 256}},
        "us-east5": {"v5p": {"spot": 512}},
        "us-east5-b": {"v5p": {"reserved": 32}},
        "reservations": {"team-a": 128},
    }
    book = FirestorePools(firestore_client).quotas()
    spot = book.limits(PoolKey("v5p", "spot", "us-east5"))
    assert (spot.total, dict(spot.zones)) == (512, {"us-east5-a": 256})
    assert book.limits(PoolKey("v5p", "reserved", "us-east5", "team-a")).total == 128

    limits = [
        (row["location"], row["scope"], row["tier"], row["reservation"], row["quota"])
        for row in json.loads(run("show", "-o", "json").stdout)["pools"]
    ]
    assert sorted(limits) == sorted(
        [
            ("us-east5-a", "zone", "on-demand", "", 64),
            ("us-east5", "region", "spot", "", 512),
            ("us-east5-a", "zone", "spot", "", 256),
            ("us-east5-b", "zone", "reserved", "", 32),
            ("", "reservation", "reserved", "team-a", 128),
        ]
    )
    table = run("show").stdout
    assert "LOCATION" in table and "SCOPE" in table and "reserved: team-a" in table

    assert run("unset", "us-east5-a", "v5p").exit_code == 0
    assert run("unset-reservation", "team-a").exit_code == 0
    assert run("unset", "us-east5", "v5p", "--tier", "spot").exit_code == 0
    assert stored(firestore_client) == {"us-east5-a": {"v5p": {"spot": 256}}, "us-east5-b": {"v5p": {"reserved": 32}}}


def test_a_bare_number_typed_by_an_admin_stays_bare_until_another_tier_joins_it(run, firestore_client):
    """The old format (family: chips, on-demand) keeps its shape through an on-demand edit."""
    firestore_client.collection("config").document("quotas").set({"us-central2-b": {"v4": 64}})
    assert run("set", "us-central2-b", "v4", "32").exit_code == 0
    assert stored(firestore_client) == {"us-central2-b": {"v4": 32}}
    assert run("set", "us-central2-b", "v4", "128", "--tier", "spot").exit_code == 0
    assert stored(firestore_client) == {"us-central2-b": {"v4": {"on-demand": 32, "spot": 128}}}


def test_show_counts_a_zones_holders_under_its_quota_and_all_under_the_regions(run, firestore_client):
    """Chips held in zone b count under the region's quota, not under zone a's."""
    from datetime import datetime, timezone

    pools = FirestorePools(firestore_client)
    run("set", "us-east5", "v5p", "512", "--tier", "spot")
    run("set", "us-east5-a", "v5p", "256", "--tier", "spot")
    pool = "v5p@us-east5:spot"
    since = datetime(2026, 3, 1, tzinfo=timezone.utc)
    assert pools.change(pools.view(pool), add=Holder("a-1", 32, 1, "medium", since, zone="us-east5-a"))
    assert pools.change(pools.view(pool), add=Holder("b-1", 64, 1, "medium", since, zone="us-east5-b"))
    rows = {row["scope"]: row for row in json.loads(run("show", "-o", "json").stdout)["pools"]}
    assert (rows["region"]["held"], rows["region"]["holders"]) == (96, 2)
    assert (rows["zone"]["held"], rows["zone"]["holders"]) == (32, 1)


def test_show_warns_of_what_the_document_holds_that_makes_no_sense(run, firestore_client):
    """An entry typed by hand in the console that no limit can be made of: a warning, the rest shown."""
    firestore_client.collection("config").document("quotas").set(
        {"us-central2-b": {"v4": 64, "v9": 8}, "us-central2": {"v4": {"reserved": 16}}}
    )
    result = run("show")
    assert result.exit_code == 0, result.output
    assert "Warning" in result.stderr and "no such TPU family" in result.stderr
    assert "reservations are zonal" in result.stderr
    assert "us-central2-b" in result.stdout and "64" in result.stdout
    assert json.loads(run("show", "-o", "json").stdout)["problems"]


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (("set", "not a zone", "v4", "8"), "neither a zone"),
        (("set", "us-central2-b", "v9", "8"), "no TPU family"),
        (("set", "us-central2-b", "v4", "-1"), "-1"),
        (("set", "us-central2", "v4", "8", "--tier", "reserved"), "reservations are zonal"),
        (("set", "us-central2-b", "v4", "8", "--tier", "flex-start"), "flex-start"),
        (("set-reservation", "team a", "8"), "not a reservation name"),
    ],
)
def test_bad_quotas_are_refused_and_nothing_is_written(run, firestore_client, args, complaint):
    result = run(*args)
    assert result.exit_code != 0 and complaint in result.output
    assert stored(firestore_client) == {}
