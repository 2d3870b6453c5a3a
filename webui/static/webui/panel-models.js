// Models page: follows the pull or verify job named on the page (data-job, data-worker) over
// ws/panel/job/WORKER/ID/ with a progress bar (bytes, rate, ETA) and a Cancel button; a pull that ends well
// reloads the list, a verify shows its result ("verified: …", or the error naming the first bad tensor).
(function () {
  "use strict";
  var box = document.getElementById("job");
  if (!box) return;
  var bar = document.getElementById("job-bar"), statusEl = document.getElementById("job-status");
  var numbers = document.getElementById("job-numbers"), errorEl = document.getElementById("job-error");
  var cancel = document.getElementById("job-cancel");
  var samples = []; // [seconds, bytes] of the last few progress events, for the rate
  var shown = -1, finished = false, retry = 500;
  window.rkmojoJob = {progress: []}; // what the page showed, for tests

  function mib(n) { return (n / 1048576).toFixed(1) + " MiB"; }
  function eta(s) { return s < 90 ? Math.round(s) + " s" : Math.round(s / 60) + " min"; }

  function progress(ev) {
    statusEl.textContent = ev.status;
    if (ev.total == null || ev.completed == null || ev.completed < shown) return; // a reconnect replays the stream
    shown = ev.completed;
    var now = performance.now() / 1000;
    samples.push([now, ev.completed]);
    while (samples.length > 2 && now - samples[0][0] > 5) samples.shift();
    bar.max = ev.total || 1;
    bar.value = ev.completed;
    var text = mib(ev.completed) + " / " + mib(ev.total);
    var dt = samples.length > 1 ? now - samples[0][0] : 0;
    if (dt >= 0.2) { // a reconnect replays the events within milliseconds: no rate from those
      var rate = (ev.completed - samples[0][1]) / dt;
      if (rate > 0) text += " · " + mib(rate) + "/s · ETA " + eta((ev.total - ev.completed) / rate);
    }
    numbers.textContent = text;
    window.rkmojoJob.progress.push(ev.completed / (ev.total || 1));
  }

  function end(ok, message) {
    finished = true;
    cancel.hidden = true;
    numbers.textContent = numbers.textContent.split(" · ")[0]; // the rate and ETA of a job that ended
    if (ok) {
      bar.value = bar.max;
      statusEl.className = "ok";
      // a verify's last status is its result ("verified: …"): it stays (the model's page keeps it as
      // "Last verified"); a pull's list reloads with the new model
      if (/^verified/.test(statusEl.textContent)) return;
      statusEl.textContent = "done";
      setTimeout(function () { location.replace("/panel/models/"); }, 800);
    } else {
      errorEl.hidden = false;
      errorEl.textContent = message;
      statusEl.textContent = "failed";
    }
  }

  var ws;
  function connect() { // the job's events are kept in Redis: a new socket replays them from the first
    ws = new WebSocket(location.protocol.replace("http", "ws") + "//" + location.host + "/ws/panel/job/" +
                       encodeURIComponent(box.dataset.worker) + "/" + encodeURIComponent(box.dataset.job) + "/");
    ws.onopen = function () { retry = 500; };
    ws.onmessage = function (m) {
      var ev = JSON.parse(m.data);
      if (finished) return;
      if (ev.t === "progress") progress(ev);
      else if (ev.t === "start" && shown < 0) statusEl.textContent = "started";
      else if (ev.t === "final") end(ev.finish_reason !== "cancelled", "cancelled");
      else if (ev.t === "error") end(false, ev.message);
    };
    ws.onclose = function (e) {
      if (finished) return;
      if (e.code === 4401) { // the session ended (webui/socket_auth.py): no reconnecting
        var link = document.createElement("a");
        link.href = "/login/?next=" + encodeURIComponent(location.pathname);
        link.textContent = "sign in again";
        statusEl.replaceChildren("Signed out — ", link);
        return;
      }
      statusEl.textContent = "reconnecting…";
      setTimeout(connect, retry);
      retry = Math.min(retry * 2, 8000);
    };
  }
  connect();
  cancel.addEventListener("click", function () {
    ws.send(JSON.stringify({cancel: true}));
    cancel.disabled = true;
    statusEl.textContent = "cancelling…";
  });
})();
