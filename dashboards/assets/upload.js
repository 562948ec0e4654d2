// The library's uploads go to POST /upload as multipart form data, which the server writes to disk a
// piece at a time. (Dash's own upload component would carry the files base64-encoded inside one
// callback body, held whole in the server's memory.) Files chosen or dropped together are the ranks
// of one job; the library table, polled every second, shows the new trace once it is registered.
(function () {
  "use strict";

  function say(text, ok) {
    var status = document.getElementById("upload-status");
    if (!status) { return; }
    status.textContent = text;
    status.className = ok ? "ok" : "error";
  }

  function send(files) {
    if (!files || files.length === 0) { return; }
    var form = new FormData();
    for (var i = 0; i < files.length; i++) { form.append("files", files[i], files[i].name); }
    say("Uploading " + files.length + " file(s)…", true);
    fetch("/upload", { method: "POST", body: form, credentials: "same-origin" })
      .then(function (answer) {
        var json = (answer.headers.get("Content-Type") || "").indexOf("json") >= 0;
        return (json ? answer.json() : answer.text()).then(function (body) {
          if (answer.ok && json && body.trace_id !== undefined) {
            say("Uploaded as trace " + body.trace_id + "; analysing.", true);
          } else {
            say(json ? body.error : String(body).trim(), false);
          }
        });
      })
      .catch(function (error) { say("Upload failed: " + error, false); });
  }

  // Dash has no file input component: give the library's upload label one, whenever it is drawn
  function addInputs() {
    var labels = document.querySelectorAll("#upload label.upload-choose");
    for (var i = 0; i < labels.length; i++) {
      if (!labels[i].querySelector("input")) {
        var input = document.createElement("input");
        input.type = "file";
        input.name = "files";
        input.multiple = true;
        input.accept = ".sqlite,.db,.sqlite3";
        labels[i].appendChild(input);
      }
    }
  }
  new MutationObserver(addInputs).observe(document.documentElement, { childList: true, subtree: true });

  document.addEventListener("change", function (event) {
    var input = event.target;
    if (input && input.matches && input.matches("#upload input[type=file]")) {
      send(input.files);
      input.value = "";  // the same file chosen again is a new upload
    }
  });
  document.addEventListener("dragover", function (event) {
    if (event.target.closest && event.target.closest("#upload")) { event.preventDefault(); }
  });
  document.addEventListener("drop", function (event) {
    if (event.target.closest && event.target.closest("#upload")) {
      event.preventDefault();
      send(event.dataTransfer.files);
    }
  });
})();
