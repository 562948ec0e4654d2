/* nsysan: unsaved review edits (dashboards/pages/finding.py).
 *
 * reviewDirty is a clientside callback: it marks #review-form data-dirty="true" while the status or
 * assignee differs from what the page last saved or loaded, or the comment box holds text. While it
 * does, leaving the page asks first: closing or reloading the tab (beforeunload), and following a
 * link inside the dashboard (which changes the page without unloading it). A file, not an inline
 * script: the Content-Security-Policy allows only this server's scripts.
 */
window.dash_clientside = Object.assign({}, window.dash_clientside, {
    nsysan: {
        reviewDirty: function (status, assignee, comment, seen) {
            var text = function (v) { return (v === null || v === undefined) ? "" : String(v).trim(); };
            var edited = !!seen && (text(status) !== text(seen.status) || text(assignee) !== text(seen.assignee));
            return (edited || text(comment) !== "") ? "true" : "false";
        }
    }
});

(function () {
    var MESSAGE = "This finding has unsaved review edits. Leave the page and lose them?";
    function unsaved() {
        var form = document.getElementById("review-form");
        return !!form && form.getAttribute("data-dirty") === "true";
    }
    window.addEventListener("beforeunload", function (event) {
        if (unsaved()) {
            event.preventDefault();
            event.returnValue = MESSAGE;  // older browsers show it; newer ones their own words
            return MESSAGE;
        }
    });
    // a dashboard link changes the page in place: ask before it does (capture: before Dash's handler)
    window.addEventListener("click", function (event) {
        var link = event.target && event.target.closest ? event.target.closest("a[href]") : null;
        if (!link || !unsaved() || link.target === "_blank" || link.hasAttribute("download")) {
            return;
        }
        if (!window.confirm(MESSAGE)) {
            event.preventDefault();
            event.stopPropagation();
        }
    }, true);
})();
