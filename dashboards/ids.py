"""Component ids, in one place: callbacks, layouts and the browser tests all name them from here."""

URL = "url"
PAGE = "page"
AUTHOR = "author"  # the reviewer's name, kept in the browser when there is no login
AUTHOR_STORE = "author-store"

# library
UPLOAD = "upload"
SCAN = "scan-traces-dir"
LIBRARY_MESSAGE = "library-message"
LIBRARY_TABLE = "library-table"
LIBRARY_POLL = "library-poll"
LIBRARY_SORT = "library-sort"
SEARCH_ALL = "search-all"  # findings of every trace, by text
SEARCH_ALL_RESULTS = "search-all-results"

# trace overview
TIMELINE = "timeline"
TRACE_ID = "trace-id"
TRACE_POLL = "trace-poll"
NOTE_TEXT = "note-text"
NOTE_ADD = "note-add"
REANALYSE_SETTINGS = "reanalyse-settings"
REANALYSE = "reanalyse"
REANALYSE_MESSAGE = "reanalyse-message"
NOTES = "notes"
STEP_BREAKDOWN = "step-breakdown"  # stacked bars: where each rank's step time went (the document's steps section)
STEP_BREAKDOWN_NOTE = "step-breakdown-note"  # the line said instead when the document has no steps section

# findings
FINDINGS_TABLE = "findings-table"
FILTER_KIND = "filter-kind"
FILTER_SEVERITY = "filter-severity"
FILTER_STATUS = "filter-status"
FILTER_RANK = "filter-rank"
FILTER_TEXT = "filter-text"  # title, kind, group key or kernel text
OCCURRENCES = "occurrences"  # a headline's occurrences, shown when its row is clicked
OCCURRENCES_TABLE = "occurrences-table"
LISTED_GROUP = "listed-group"  # the headline whose occurrences are listed (a grid re-sending it lists nothing anew)
GROUP_STATUS = "group-status"  # triage of the listed occurrences in one action
GROUP_ASSIGNEE = "group-assignee"
GROUP_APPLY = "group-apply"
GROUP_VERSIONS = "group-versions"  # {finding id: version} as listed, so a concurrent edit is not overwritten
GROUP_MESSAGE = "group-message"

# finding detail and review
FINDING_ID = "finding-id"
FINDING_VERSION = "finding-version"
FINDING_TIMELINE = "finding-timeline"
STATUS = "finding-status"
ASSIGNEE = "finding-assignee"
SAVE = "finding-save"
REVIEW_MESSAGE = "review-message"
COMMENT_TEXT = "comment-text"
COMMENT_ADD = "comment-add"
COMMENTS = "comments"  # the thread: comments and review events
REVIEW_POLL = "review-poll"  # re-reads the finding's review while the page is open
REVIEW_SEEN = "review-seen"  # what the page last showed: version, status, assignee, thread size
REVIEW_FORM = "review-form"  # the form's saved values as data-* attributes, for the unsaved-changes warning

# compare
COMPARE_BEFORE = "compare-before"
COMPARE_BREAKDOWN = "compare-breakdown"
COMPARE_AFTER = "compare-after"
COMPARE_RESULT = "compare-result"
