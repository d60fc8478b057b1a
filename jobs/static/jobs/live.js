/* Live job pages, no build step.
 *
 * [data-live-job]  follows /ws/jobs/{id}/?after=<last seq>: status, progress bar, timeline, and
 *                  the panel (result, error, open questions with their answer forms) re-fetched
 *                  when the status changes or a question event arrives; what a reviewer typed
 *                  into an answer form is kept across the refresh. The page shows the newest
 *                  events; "Show earlier events" pages back through /api/jobs/{id}/events/.
 * [data-live-feed] follows /ws/jobs/: the status of each listed job, new jobs on top.
 *
 * Each connection takes a ticket first (POST data-ticket-url with the session; a ticket is good
 * for one connection, so every reconnect asks again). Both reconnect with exponential backoff
 * (0.5 s doubling to 15 s, with jitter); a socket dropped for reading too slowly (4408) comes
 * back at once. A job page resumes from the last seq it showed, so after a reconnect it gets
 * exactly what it missed. 4403 (may not see the job) and 4401 (signed out, or the credential
 * was revoked) end following; 4429 (too many live streams) retries slowly.
 */
(function () {
  "use strict";
  var TERMINAL = ["completed", "failed", "cancelled"];

  function socketUrl(path) {
    return (location.protocol === "https:" ? "wss://" : "ws://") + location.host + path;
  }

  /* A ticket for one websocket connection (null when none could be had: the session cookie
   * alone then authenticates the socket). */
  function ticket(root) {
    if (!root.dataset.ticketUrl) return Promise.resolve(null);
    return fetch(root.dataset.ticketUrl, {
      method: "POST", credentials: "same-origin",
      headers: {"X-CSRFToken": root.dataset.csrfToken || "", "Accept": "application/json"}
    }).then(function (r) { return r.ok ? r.json() : null; })
      .then(function (body) { return body && body.ticket; }, function () { return null; });
  }

  function withTicket(path, value) {
    return value ? path + (path.indexOf("?") < 0 ? "?" : "&") + "ticket=" + encodeURIComponent(value) : path;
  }

  /* Open url() with a fresh ticket, pass each JSON message to onMessage; reopen after a close,
   * backing off. */
  function follow(root, url, onMessage, onState) {
    var attempt = 0;
    function open() {
      ticket(root).then(function (value) {
        var ws = new WebSocket(socketUrl(withTicket(url(), value)));
        ws.onopen = function () { attempt = 0; onState("live"); };
        ws.onmessage = function (e) { onMessage(JSON.parse(e.data)); };
        ws.onclose = function (e) {
          if (e.code === 4403) { onState("not allowed"); return; }
          if (e.code === 4401) { onState("signed out"); return; }
          if (e.code === 4408) { attempt = 0; onState("catching up"); setTimeout(open, 0); return; }
          if (e.code === 4429) attempt = Math.max(attempt, 5);
          var delay = Math.min(15000, 500 * Math.pow(2, attempt++)) * (0.75 + Math.random() / 2);
          onState("reconnecting in " + Math.round(delay / 100) / 10 + " s");
          setTimeout(open, delay);
        };
      });
    }
    open();
  }

  function role(root, name) { return root.querySelector('[data-role="' + name + '"]'); }

  function setStatus(el, status) {
    if (!el) return;
    el.textContent = status;
    el.className = "status status-" + status;
  }

  function setProgress(root, fraction, text) {
    var bar = role(root, "progress");
    if (bar) bar.value = fraction;
    var percent = role(root, "percent");
    if (percent) percent.textContent = Math.round(fraction * 100) + "%";
    var label = role(root, "progress-text");
    if (label && text !== undefined) label.textContent = text;
  }

  /* One timeline entry: its number, its time (to the second, UTC) and its sentence, which the
   * server wrote (`text`, jobs.presenters.event_text), so every page words an event the same. */
  function eventItem(event) {
    var li = document.createElement("li");
    li.className = "event event-" + event.type;
    li.dataset.seq = event.seq;
    li.dataset.type = event.type;
    var seq = document.createElement("span");
    seq.className = "seq";
    seq.textContent = "#" + event.seq;
    var time = document.createElement("time");
    time.dateTime = event.created_at || "";
    time.title = event.created_at || "";
    time.textContent = (event.created_at || "").slice(11, 19);
    var text = document.createElement("span");
    text.className = "text";
    text.textContent = event.text || [event.type, event.step, event.status].filter(Boolean).join(" ");
    li.append(seq, " ", time, " ", text);
    return li;
  }

  var EARLIER_PAGE = 50;

  /* "Show earlier events": the page shows the newest events; each press fetches the 50 before
   * the first one shown from the events API (seqs have no gaps, so `after` finds them). */
  function showEarlier(button, timeline) {
    var first = timeline.firstElementChild ? parseInt(timeline.firstElementChild.dataset.seq, 10) : 1;
    if (first <= 1) { button.parentNode.hidden = true; return; }
    var after = Math.max(0, first - 1 - EARLIER_PAGE);
    button.disabled = true;
    fetch(button.dataset.eventsUrl + "?after=" + after + "&limit=" + (first - 1 - after),
          {credentials: "same-origin", headers: {Accept: "application/json"}})
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(function (events) {
        var anchor = timeline.firstElementChild;
        events.forEach(function (event) {
          if (event.seq < first) timeline.insertBefore(eventItem(event), anchor);
        });
        var count = button.parentNode.querySelector('[data-role="hidden-count"]');
        if (count) count.textContent = after ? after + " earlier not shown" : "";
        button.disabled = false;
        if (!after) button.parentNode.hidden = true;
      }, function () { button.disabled = false; });
  }

  /* What a reviewer typed into an answer form survives a refresh of the panel: a form the server
   * sends again for the same question gets the values back. A question that closed, or that the
   * viewer may no longer answer, comes back without a form, and its input goes with it. */
  function replacePanel(panel, html) {
    var typed = {};
    panel.querySelectorAll("form.answer[data-touched]").forEach(function (form) {
      typed[form.dataset.questionId] = form;
    });
    var focused = document.activeElement;
    var fresh = document.createElement("div");
    fresh.innerHTML = html;
    var refocus = null;
    fresh.querySelectorAll("form.answer[data-question-id]").forEach(function (form) {
      var old = typed[form.dataset.questionId];
      if (!old) return;
      form.dataset.touched = "1";
      Array.prototype.forEach.call(old.elements, function (el) {
        if (!el.name || el.type === "hidden" || el.type === "submit" || el.name === "csrfmiddlewaretoken") return;
        var same = Array.prototype.filter.call(form.elements, function (other) {
          return other.name === el.name && (el.type !== "radio" && el.type !== "checkbox" || other.value === el.value);
        })[0];
        if (!same) return;
        if (el.type === "radio" || el.type === "checkbox") same.checked = el.checked;
        else if (el.tagName === "SELECT" && el.multiple) {
          Array.prototype.forEach.call(same.options, function (option) {
            option.selected = Array.prototype.some.call(el.selectedOptions, function (o) { return o.value === option.value; });
          });
        } else same.value = el.value;
        if (el === focused) refocus = same;
      });
    });
    panel.replaceChildren.apply(panel, Array.prototype.slice.call(fresh.childNodes));
    if (refocus) refocus.focus();
  }

  function markTyped(e) { // a form the reviewer has changed keeps its values across refreshes
    if (e.target.form && e.target.form.classList.contains("answer")) e.target.form.dataset.touched = "1";
  }

  function liveJob(root) {
    var lastSeq = parseInt(root.dataset.lastSeq || "0", 10);
    var panelUrl = root.dataset.panelUrl;
    var timeline = role(root, "timeline");
    var refreshing = null;
    var panel = role(root, "panel");
    if (panel) { panel.addEventListener("input", markTyped); panel.addEventListener("change", markTyped); }
    var earlier = role(root, "show-earlier");
    if (earlier && timeline) earlier.addEventListener("click", function () { showEarlier(earlier, timeline); });

    function refreshPanel() { // coalesce bursts of status changes into one fetch
      if (refreshing) return;
      refreshing = setTimeout(function () {
        refreshing = null;
        fetch(panelUrl, {credentials: "same-origin"}).then(function (r) { return r.ok ? r.text() : null; })
          .then(function (html) { if (html !== null) replacePanel(role(root, "panel"), html); });
      }, 50);
    }

    function onEvent(event) {
      if (event.seq <= lastSeq) return; // already shown
      lastSeq = event.seq;
      root.dataset.lastSeq = lastSeq;
      if (timeline) {
        timeline.appendChild(eventItem(event));
        timeline.scrollTop = timeline.scrollHeight;
      }
      if (event.type === "progress") setProgress(root, event.message.fraction, event.message.text);
      if (event.type === "status") {
        setStatus(role(root, "status"), event.status);
        if (event.status === "completed") setProgress(root, 1);
        refreshPanel();
      }
      if (event.type === "question") refreshPanel();
    }

    follow(root, function () { return "/ws/jobs/" + root.dataset.liveJob + "/?after=" + lastSeq; }, function (msg) {
      if (msg.type === "snapshot") {
        setStatus(role(root, "status"), msg.job.status);
        if (msg.last_seq <= lastSeq) setProgress(root, msg.job.progress.fraction, msg.job.progress.text);
      } else if (msg.type === "event") {
        onEvent(msg.event);
      }
    }, function (state) { var c = role(root, "connection"); if (c) c.textContent = state; });
  }

  function liveFeed(table) {
    var body = table.tBodies[0];
    var detailUrl = table.dataset.detailUrl;
    /* A job not listed yet joins the top of the first page, when it matches the list's filters. */
    function joinsTheList(job) {
      if (table.dataset.insert === "") return false;
      if (table.dataset.filterStatus && table.dataset.filterStatus !== job.status) return false;
      return !table.dataset.filterKind || table.dataset.filterKind === job.kind;
    }
    follow(table, function () { return table.dataset.liveFeed; }, function (msg) {
      if (msg.type !== "job") return;
      var job = msg.job;
      var row = body.querySelector('tr[data-job-id="' + job.id + '"]');
      if (!row && !joinsTheList(job)) return;
      if (!row) {
        var empty = body.querySelector("tr.empty");
        if (empty) empty.remove();
        row = document.createElement("tr");
        row.dataset.jobId = job.id;
        var link = '<a href="' + detailUrl.replace("00000000-0000-0000-0000-000000000000", job.id) + '"><code>' +
          job.id.slice(0, 8) + "</code></a>";
        row.innerHTML = '<td data-label="job">' + link + '</td><td data-label="kind"></td>' +
          '<td data-label="status"><span data-role="status"></span></td>' +
          '<td data-label="progress"><progress max="1" data-role="progress" aria-label="progress"></progress></td>' +
          '<td data-label="attempts" data-role="attempts"></td><td data-label="created"><time></time></td>';
        row.children[1].textContent = job.kind;
        row.querySelector("time").textContent = job.created_at.slice(0, 19).replace("T", " ");
        body.insertBefore(row, body.firstChild);
      }
      setStatus(role(row, "status"), job.status);
      role(row, "progress").value = job.progress.fraction;
      role(row, "attempts").textContent = job.attempts;
    }, function (state) { var c = document.getElementById("feed-connection"); if (c) c.textContent = state; });
  }

  function start() {
    document.querySelectorAll("[data-live-job]").forEach(liveJob);
    document.querySelectorAll("[data-live-feed]").forEach(liveFeed);
  }
  window.taskplatformLive = {follow: follow, TERMINAL: TERMINAL};
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
