"""The review store behind ``nsysan serve`` (see docs/store.md)."""

from nsysan.store.models import FINDING_STATUSES
from nsysan.store.store import NotFound, ReviewStore, StaleEdit, StoreUnavailable, store_url

__all__ = ["FINDING_STATUSES", "NotFound", "ReviewStore", "StaleEdit", "StoreUnavailable", "store_url"]
