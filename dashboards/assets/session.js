/* nsysan: say when the server stops accepting this page's requests (issue 31: a save after the
 * session ended got HTTP 401 and the page showed nothing, so the edit was lost without a word).
 *
 * Dash sends every callback (save, comment, the review poll) with fetch and shows nothing for a
 * refused one. This watches those answers: a 401 (logged out in another tab, the login's time
 * limit, or a server restart, which ends every session) or no answer at all (the server is gone)
 * shows a banner that says nothing was saved and that the edits are still in the page, with a
 * link that signs in in a new tab, so this page and what it holds stay as they are. The next
 * answered request hides it. A file, not an inline script: the Content-Security-Policy allows only
 * this server's scripts.
 */
(function () {
    var ENDED = "Your session has ended (logged out, timed out, or the server restarted): nothing was saved. " +
        "Your unsaved edits are still on this page. ";
    var GONE = "The server cannot be reached: nothing was saved. Your unsaved edits are still on this page; " +
        "save again once it is back.";

    function banner() {
        var el = document.getElementById("session-banner");
        if (!el) {
            el = document.createElement("div");
            el.id = "session-banner";
            el.className = "session-banner";
            el.setAttribute("role", "alert");
            document.body.insertBefore(el, document.body.firstChild);
        }
        return el;
    }

    function show(kind) {
        var el = banner();
        el.setAttribute("data-kind", kind);
        el.textContent = kind === "ended" ? ENDED : GONE;
        if (kind === "ended") {
            var link = document.createElement("a");
            link.href = "/login?next=" + encodeURIComponent("/");
            link.target = "_blank";
            link.rel = "noopener";
            link.textContent = "Sign in (new tab), then save again here.";
            el.appendChild(link);
        }
        el.hidden = false;
    }

    function hide() {
        var el = document.getElementById("session-banner");
        if (el) {
            el.hidden = true;
        }
    }

    function watched(input) {
        var url = typeof input === "string" ? input : (input && input.url) || "";
        return url.indexOf("/_dash-update-component") !== -1 || url.indexOf("/upload") !== -1;
    }

    var original = window.fetch.bind(window);
    window.fetch = function (input, init) {
        if (!watched(input)) {
            return original(input, init);
        }
        return original(input, init).then(function (response) {
            if (response.status === 401) {
                show("ended");
            } else if (response.status < 500) {
                hide();
            }
            return response;
        }, function (error) {
            show("gone");
            throw error;
        });
    };
})();
