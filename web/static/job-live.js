// A job's page as it changes: its timeline grows with each event, its log with each line,
// and once the job has ended the page reloads to show its outcome. Without JavaScript the
// page is as it was loaded, and a reload shows the news.
"use strict";
(function () {
  const timeline = document.getElementById("timeline");
  const log = document.getElementById("log");
  if (!timeline || !timeline.dataset.live) return;

  const events = new EventSource(timeline.dataset.live);
  events.addEventListener("job_event", function (frame) {
    const e = JSON.parse(frame.data);
    const item = document.createElement("li");
    const at = document.createElement("time");
    at.textContent = e.at;
    const kind = document.createElement("strong");
    kind.textContent = e.kind;
    item.append(at, " ", kind);
    if (e.reason) {
      const tag = document.createElement("span");
      tag.className = "tag";
      tag.textContent = e.reason;
      item.append(" ", tag);
    }
    const message = document.createElement("div");
    message.textContent = e.message;
    item.append(message);
    timeline.append(item);
  });
  events.addEventListener("end", function () {
    events.close();
    // The log's last lines are kept before the end is recorded: they are in the new page.
    window.location.reload();
  });

  // The latest attempt's log from its first line, as it is written; a new attempt shows
  // after the next reload.
  async function follow() {
    if (!log || !log.dataset.follow) return;
    try {
      const response = await fetch(log.dataset.follow, { credentials: "same-origin" });
      if (!response.ok || response.redirected || !response.body) return;
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let first = true;
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        if (first) {
          log.textContent = "";
          first = false;
        }
        const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
        log.textContent += value;
        if (atBottom) log.scrollTop = log.scrollHeight;
      }
    } catch (_) {
      // The server restarting or the page leaving: the lines shown stay.
    }
  }
  follow();
})();
