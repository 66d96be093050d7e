"""`config/prices` on Firestore (`engine.usage_report.PriceBook`): one document read, then
`domain.prices` lays it over the shipped defaults (an absent document: the defaults alone)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpujobs.adapters.firestore_reads import transient_on_failure
from tpujobs.domain.prices import Prices, prices_from_document

if TYPE_CHECKING:
    from google.cloud import firestore

CONFIG, PRICES = "config", "prices"


class FirestorePrices:
    """`PriceBook` on Firestore."""

    def __init__(self, client: firestore.Client) -> None:
        self._db = client

    def prices(self) -> Prices:
        with transient_on_failure("read config/prices"):
            snapshot = self._db.collection(CONFIG).document(PRICES).get()
        return prices_from_document(snapshot.to_dict() if snapshot.exists else None)
