"""Re-analysis with other settings (issue 31 item 6): the settings recorded before any work starts,
so a restart resumes the analysis with them; what a re-analysis changes of a finding written into its
thread (title, severity, recoverable time, gone, found again), nothing for a finding it left as it
was; the dashboard's form refusing bad settings in one line and people the server does not let;
``nsysan serve --reanalyse-by`` checked; a schema-6 store upgraded. On SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys

import pytest
import sqlalchemy as sa
from alembic import command

from dashboards.analysis import AnalysisQueue, TimelineCache, analyse_stored_trace
from dashboards.pages.overview import reanalyse
from dashboards.server import Server
from fixtures.samples import sample_paths
from nsysan.store import ReviewStore, schema
from nsysan.store.store import ANALYSIS_AUTHOR

SLOWER = {"comm_compute_slowdown": {"min_ratio": 1.44}}  # drops some instances of the sample's slowdown


def _bodies(store: ReviewStore, finding_id: int) -> list[str]:
    return [e["body"] for e in store.finding(finding_id)["thread"] if e["kind"] == "comment"]


def _titles(store: ReviewStore, trace_id: int) -> dict[int, tuple[str, bool]]:
    return {f["id"]: (f["title"], f["present"]) for f in store.findings(trace_id, include_missing=True)}


def test_a_reanalysis_writes_what_changed_into_each_findings_thread(store):
    trace_id = store.register(sample_paths("overlap-slowdown"), name="overlap-slowdown")
    analyse_stored_trace(store, trace_id)
    before = _titles(store, trace_id)
    assert store.trace(trace_id)["settings"] == {} and not any(_bodies(store, i) for i in before)
    reviewed = next(i for i, (title, _) in before.items() if "slower" in title)
    store.update_finding(reviewed, based_on_version=1, status="confirmed", assignee="ada")
    store.comment(reviewed, "ada", "the peer copy again")

    recoverable = {f["id"]: f["recoverable_ns"] for f in store.findings(trace_id)}
    store.request_analysis(trace_id, SLOWER)
    assert store.trace(trace_id)["status"] == "registered"  # recorded before the work starts
    analyse_stored_trace(store, trace_id)
    after = _titles(store, trace_id)
    said = "settings comm_compute_slowdown.min_ratio=1.44"
    changed = [i for i in before if i in after and after[i][1] and after[i][0] != before[i][0]]
    gone = [i for i in before if not after[i][1]]
    same = [i for i in before if after[i] == (before[i][0], True)]
    assert changed and gone and same  # the sample gives all three: the test would be vacuous otherwise
    for i in changed:
        entry = _bodies(store, i)[-1]
        was, now = recoverable[i], store.finding(i)["recoverable_ns"]
        figures = f"; recoverable {was / 1e6:.3f} ms → {now / 1e6:.3f} ms" if was != now else ""
        assert entry == f"Re-analysis ({said}): title was “{before[i][0]}”, now “{after[i][0]}”{figures}."
    assert any("; recoverable 0.222 ms → 0.078 ms." in _bodies(store, i)[-1] for i in changed)
    for i in gone:
        assert _bodies(store, i)[-1] == f"No longer found by the re-analysis ({said})."
    for i in same:  # a finding the re-analysis left as it was gets nothing
        assert _bodies(store, i) == (["the peer copy again"] if i == reviewed else [])
    entries = [e for i in changed + gone for e in store.finding(i)["thread"] if e["kind"] == "comment"]
    assert {e["author"] for e in entries} - {"ada"} == {ANALYSIS_AUTHOR}
    kept = store.finding(reviewed)
    assert (kept["status"], kept["assignee"]) == ("confirmed", "ada")  # the review stays whatever changed

    store.request_analysis(trace_id, {})  # back to the defaults: what was gone is found again
    analyse_stored_trace(store, trace_id)
    final = _titles(store, trace_id)
    assert {i: final[i] for i in before} == {i: (t, True) for i, (t, _) in before.items()}
    assert all(not present for i, (_, present) in final.items() if i not in before)  # the 1.44 run's own
    for i in gone:
        assert _bodies(store, i)[-1].startswith("Re-analysis (default settings): found again")


def test_an_interrupted_reanalysis_resumes_with_its_settings(store):
    trace_id = store.register(sample_paths("overlap-slowdown"), name="overlap-slowdown")
    analyse_stored_trace(store, trace_id)
    default = _titles(store, trace_id)
    store.request_analysis(trace_id, SLOWER)
    store.start_analysis(trace_id)  # ... and the server stopped here
    assert store.trace(trace_id)["status"] == "analysing"
    queue = AnalysisQueue(store, TimelineCache(store))  # the next server
    try:
        assert queue.resume() == 1 and queue.wait(120)
    finally:
        queue.shutdown()
    t = store.trace(trace_id)
    assert (t["status"], t["settings"]) == ("ready", SLOWER)
    assert _titles(store, trace_id) != default  # analysed with min_ratio 1.44, not the defaults
    assert any("No longer found by the re-analysis (settings comm_compute_slowdown.min_ratio=1.44)" in b
               for i in default for b in _bodies(store, i))  # fmt: skip


def test_the_form_refuses_bad_settings_in_one_line_and_queues_nothing(store):
    trace_id = store.register(sample_paths("pipeline-stall"), name="pipeline-stall")
    analyse_stored_trace(store, trace_id)
    server = Server(store)
    try:
        for text, said in (
            ("comm_compute_slowdown.min_ratio", "expected KIND.PARAM=VALUE"),
            ("no_such.min_ratio=2", "no detector 'no_such'"),
            ("comm_compute_slowdown.nope=2", "has no parameter 'nope'"),
            ("comm_compute_slowdown.min_ratio=-1", "needs a finite number >= 0"),
            ("comm_compute_slowdown.min_samples=2.5", "is a whole number"),
            ("x.y=1\n" * 65, "at most 64 settings"),
            ("comm_compute_slowdown.min_ratio=" + " " * 167 + "12", "a setting of over 200 characters"),
            (
                "nccl_ordering_stall.max_position_pairs=1000000000",
                "nccl_ordering_stall.max_position_pairs=1000000000 raises a limit on the memory",
            ),
            ({"not": "text"}, "the settings are not text"),
        ):
            message, stop_polling = reanalyse(server, trace_id, text)
            assert message.className == "error" and message.children.startswith("Not re-analysed: ") and stop_polling
            assert said in message.children and not message.children.startswith("Not re-analysed: --set")
        assert store.trace(trace_id)["status"] == "ready" and store.trace(trace_id)["settings"] == {}
        lowered = reanalyse(server, trace_id, "nccl_ordering_stall.max_candidates=32")[0]  # a limit lowered: fine
        assert lowered.className == "ok" and server.analysis.wait(120)

        server.reanalysers = frozenset()  # --reanalyse-by nobody
        message, _ = reanalyse(server, trace_id, "")
        assert message.children == "Not re-analysed: this server lets only some users re-analyse traces."
        assert store.trace(trace_id)["status"] == "ready"

        server.reanalysers = None
        message, stop_polling = reanalyse(server, trace_id, " nccl_ordering_stall.min_stall_ns = 5000 \n\n")
        assert server.store.trace(trace_id)["status"] in ("registered", "analysing")  # queued at once (or started)
        assert message.className == "ok" and not stop_polling
        assert store.trace(trace_id)["settings"] == {"nccl_ordering_stall": {"min_stall_ns": 5000}}
        message, _ = reanalyse(server, trace_id, "")  # queued or running: refused, not queued twice
        assert message.children == "Not re-analysed: the trace is being analysed already; try again when it is done"
        assert server.analysis.wait(120)
        assert store.trace(trace_id)["status"] == "ready"
    finally:
        server.analysis.shutdown()


@pytest.mark.parametrize(
    ("option", "users", "said"),
    [
        ("ada", "", "--reanalyse-by names users, but the server has no login"),
        ("ada,zed", "ada={hash}", "--reanalyse-by: zed is not a user of this server"),
    ],
)
def test_serve_checks_reanalyse_by(tmp_path, option, users, said):
    from dashboards.auth import hash_password

    users = users.format(hash=hash_password("pass-word-42"))
    done = subprocess.run([sys.executable, "-m", "nsysan", "serve", "--db", str(tmp_path / "s.sqlite"),
                           "--reanalyse-by", option], env={"NSYSAN_USERS": users, "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert (
        done.returncode == 2 and done.stderr.startswith(f"nsysan: error: {said}") and len(done.stderr.splitlines()) == 1
    )


def test_a_schema_6_store_gains_settings_and_owners(url):
    engine = sa.create_engine(url)
    with engine.begin() as c:
        command.upgrade(schema.config(c), "0006")
    with engine.begin() as c:
        c.execute(sa.text("INSERT INTO traces (name, paths, status, ranks, devices, summary, registered_at) "
                          "VALUES ('six', '[\"/z.sqlite\"]', 'ready', '[0]', '[0]', '{}', CURRENT_TIMESTAMP)"))  # fmt: skip
    engine.dispose()
    s = ReviewStore(url)
    (t,) = s.traces()
    assert (t["name"], t["status"], t["settings"], t["owner"]) == ("six", "ready", {}, None)  # schemas 7 and 8
    s.request_analysis(t["id"], SLOWER)
    assert s.trace(t["id"])["settings"] == SLOWER
    assert s.uploaded_bytes(None) == 0 and s.deletions() == []


def test_with_login_only_the_users_reanalyse_by_names_may(store):
    import flask

    from dashboards.pages.overview import _reanalysis_form

    trace_id = store.register(sample_paths("pipeline-stall"), name="pipeline-stall")
    server = Server(store, users={"ada": "h", "ben": "h"}, reanalysers=frozenset({"ada"}))
    app = flask.Flask(__name__)
    app.secret_key = "test"
    try:
        with app.test_request_context():
            flask.session["user"] = "ben"
            assert not server.may_reanalyse()
            form = _reanalysis_form(server, store.trace(trace_id))
            assert [c.disabled for c in form.children if hasattr(c, "disabled")] == [True, True]
            message, _ = reanalyse(server, trace_id, "")
            assert message.className == "error" and store.trace(trace_id)["status"] == "registered"
            flask.session["user"] = "ada"
            assert server.may_reanalyse()
            assert reanalyse(server, trace_id, "")[0].children.startswith(
                "Not re-analysed: the trace is being analysed"
            )
    finally:
        server.analysis.shutdown()


def test_nobody_writes_in_a_thread_as_nsysan(store):
    from dashboards.auth import hash_password, load_users
    from nsysan.errors import InputError

    assert Server(store).author(ANALYSIS_AUTHOR) == "anonymous" and Server(store).author(" ada ") == "ada"
    with pytest.raises(InputError, match="the name is nsysan's own"):
        load_users(None, f"{ANALYSIS_AUTHOR}={hash_password('pass-word-42')}")
