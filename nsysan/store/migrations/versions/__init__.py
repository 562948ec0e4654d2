"""One module per store schema revision, oldest first (``s0001_...``); see docs/store.md."""
