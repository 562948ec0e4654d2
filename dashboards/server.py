"""What the pages need from the process, in one object: the store, the background analysis, the
timelines, the limits and the users. Its own module so that the app imports the pages and the pages
import this, never the app."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from dashboards import auth
from dashboards.analysis import AnalysisQueue, TimelineCache
from nsysan.store import ReviewStore
from nsysan.store.store import ANALYSIS_AUTHOR

DEFAULT_MAX_UPLOAD_MB = 200


@dataclass
class Server:
    store: ReviewStore
    traces_dir: Path | None = None
    uploads_dir: Path = Path("nsysan-uploads")
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_MB * 2**20
    users: dict[str, str] = field(default_factory=dict)
    session_hours: float = auth.DEFAULT_SESSION_HOURS  # a login lasts this long at most
    secure_cookies: bool = False  # send the session cookie over HTTPS only
    # who may re-analyse a trace with other settings: None everyone who may use the dashboard, else these
    # users (empty: nobody); `nsysan serve --reanalyse-by`
    reanalysers: frozenset[str] | None = None
    # with login: users who may delete anyone's upload (an upload's owner may delete their own)
    admins: frozenset[str] = frozenset()
    upload_quota_bytes: int | None = None  # what one uploader's traces may take on disk; None: no quota
    refused: list[str] = field(default_factory=list)  # why exports in traces_dir were not registered (last scan)
    timelines: TimelineCache = field(init=False)
    scan_lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    # uploads one at a time from the quota check to the register: two at once must not both fit a quota
    upload_lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    analysis: AnalysisQueue = field(init=False)

    def __post_init__(self) -> None:
        self.timelines = TimelineCache(self.store)
        self.analysis = AnalysisQueue(self.store, self.timelines)

    @property
    def login_required(self) -> bool:
        return bool(self.users)

    def may_reanalyse(self) -> bool:
        """Whether the person asking may re-analyse traces (the logged-in user, with login on)."""
        if self.reanalysers is None:
            return True
        user = auth.current_user()
        return user is not None and user in self.reanalysers

    def may_delete(self, owner: str | None) -> bool:
        """Whether the person asking may delete an upload of ``owner``'s: anyone without login (a
        loopback-only server, whose users share one machine), else its owner or an admin."""
        if not self.login_required:
            return True
        user = auth.current_user()
        return user is not None and (user == owner or user in self.admins)

    def author(self, typed: str | None) -> str:
        """Who is writing: the logged-in user, else the name typed in the header (no login on loopback)."""
        name = auth.current_user() or (typed or "").strip()[:64] or "anonymous"
        return "anonymous" if name == ANALYSIS_AUTHOR else name  # nsysan's own name, for what a re-analysis writes
