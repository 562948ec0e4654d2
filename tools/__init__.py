"""Repository tooling that is not part of nsysan and is not installed with it (like ``fixtures``):
``browser`` starts ``nsysan serve`` and Chromium for the browser tests, the screenshots and
benchmarks/overview.py; ``screenshots`` photographs the dashboard for docs/."""
