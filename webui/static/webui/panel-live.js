// The live view: worker cards fed by ws/panel/live/ (WorkerStats as JSON, at most 2 a second per worker).
// The server renders the latest sample; this adds history charts (uPlot), the memory bar's legend and the
// expert heatmap, and keeps them current. The charts start with each worker's last two minutes: the page's
// #live-history, and a {t: "history"} message before a worker's first stats on every (re)connect.
// window.rkmojoLive counts what arrived and what was drawn (points: samples in a worker's charts).
(function () {
  "use strict";
  var HISTORY = 120; // samples kept per chart (two minutes at 1 Hz)
  var MEM = [["dense", "dense"], ["kv", "KV"], ["expert_slots", "expert slots"], ["prefetch_slots", "prefetch"],
             ["runtime", "runtime"], ["free", "free"]];
  var CHARTS = [["tps", "tok/s", "#2a62d6", function (s) { return s.tokens_per_s; }],
                ["ttft", "TTFT s", "#f28e2b", function (s) { return s.ttft == null ? null : s.ttft; }],
                ["hit", "hit rate %", "#59a14f", function (s) { return s.expert_hit_rate == null ? null : 100 * s.expert_hit_rate; }],
                ["disk", "disk MB/s", "#b07aa1", function (s) { return s.disk_mb_per_s; }]];
  var grid = document.getElementById("workers");
  var tpl = document.getElementById("worker-card");
  var status = document.getElementById("live-status");
  var cards = {};
  var live = window.rkmojoLive = {messages: 0, renders: 0, first: null, last: null, perWorker: {}, points: {}};

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }
  function fmt(x, digits) { return x == null ? "—" : Number(x).toFixed(digits); }
  function bytes(n) {
    var units = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : n.toFixed(0)) + " " + units[i];
  }

  function card(name) {
    if (cards[name]) return cards[name];
    var node = grid.querySelector('[data-worker="' + CSS.escape(name) + '"]');
    if (!node) {
      node = tpl.content.firstElementChild.cloneNode(true);
      node.dataset.worker = name;
      node.querySelector("h2").textContent = name;
      grid.appendChild(node);
      var none = document.getElementById("no-stats");
      if (none) none.remove();
    }
    var c = cards[name] = {node: node, hist: {t: []}, plots: {}, heat: null};
    var charts = el("div", "charts");
    node.querySelector(".membar").after(el("div", "legend"));
    node.querySelector(".legend").after(charts);
    CHARTS.forEach(function (spec) {
      c.hist[spec[0]] = [];
      var box = el("div", "chart");
      box.appendChild(el("div", "title", spec[1]));
      charts.appendChild(box);
      c.plots[spec[0]] = {box: box, spec: spec, plot: null};
    });
    return c;
  }

  function plot(c, key) {
    var p = c.plots[key];
    var data = [c.hist.t, c.hist[key]];
    var width = Math.max(100, p.box.clientWidth);
    if (!p.plot) {
      p.plot = new uPlot({width: width, height: 110, legend: {show: false}, cursor: {show: false},
                          // a window ending at the latest sample, 30 s to two minutes wide (one sample alone
                          // would span years)
                          scales: {x: {time: true, range: function (u, min, max) {
                            return [max - Math.min(HISTORY, Math.max(30, max - min)), max + 1]; }}}, axes: [{size: 24, font: "10px system-ui"}, {size: 36, font: "10px system-ui"}],
                          series: [{}, {stroke: p.spec[2], width: 1.5, fill: p.spec[2] + "22", spanGaps: true,
                                            points: {show: function (u, si, i0, i1) { return i1 - i0 < 30; }}}]},
                         data, p.box);
    } else {
      if (Math.abs(p.plot.width - width) > 4) p.plot.setSize({width: width, height: 110});
      p.plot.setData(data);
    }
  }

  function setText(node, f, text) { node.querySelector('[data-f="' + f + '"]').textContent = text; }

  function membar(c, m) {
    var bar = c.node.querySelector(".membar"), legend = c.node.querySelector(".legend");
    var whole = m.total || MEM.reduce(function (a, p) { return a + (m[p[0]] || 0); }, 0) || 1;
    bar.textContent = "";
    legend.textContent = "";
    MEM.forEach(function (p) {
      var v = m[p[0]] || 0;
      if (!v) return;
      var seg = el("span", "mem mem-" + p[0]);
      seg.style.width = (100 * v / whole).toFixed(2) + "%";
      seg.title = p[1] + ": " + bytes(v);
      bar.appendChild(seg);
      var item = el("span", null, p[1] + " " + bytes(v));
      item.prepend(el("i", "mem mem-" + p[0]));
      legend.appendChild(item);
    });
    if (m.total) legend.appendChild(el("span", null, "budget " + bytes(m.total)));
  }

  function heatmap(c, h) {
    if (!h) { if (c.heat) { c.heat.box.remove(); c.heat = null; } return; }
    if (!c.heat) {
      var box = el("div", "heatmap");
      var bar = el("div", "bar");
      bar.appendChild(el("b", null, "Expert cache"));
      var title = el("span", "muted");
      bar.appendChild(title);
      var mode = "hits";
      ["hits", "misses", "residency"].forEach(function (m) {
        var lab = el("label"), r = el("input");
        r.type = "radio"; r.name = "heat-" + c.node.dataset.worker; r.value = m; r.checked = m === mode;
        r.addEventListener("change", function () { c.heat.mode = m; draw(c); });
        lab.appendChild(r); lab.appendChild(document.createTextNode(" " + m));
        bar.appendChild(lab);
      });
      var body = el("div", "body"), canvas = el("canvas"), rates = el("ol");
      canvas.setAttribute("aria-label", "layer by expert heatmap");
      body.appendChild(canvas); body.appendChild(rates);
      box.appendChild(bar); box.appendChild(body);
      box.appendChild(el("p", "hint", "Rows are MoE layers, columns experts; brighter: more over the last minutes. "
                                       + "Residency: green in a cache slot, blue prefetched. Red layers hit least."));
      c.node.appendChild(box);
      c.heat = {box: box, canvas: canvas, rates: rates, title: title, mode: mode, data: null};
    }
    c.heat.data = h;
    c.heat.title.textContent = h.model + " · " + h.layer_ids.length + " × " + h.experts + " · half-life " + h.half_life + " s";
    draw(c);
  }

  function draw(c) {
    var h = c.heat.data, canvas = c.heat.canvas, mode = c.heat.mode;
    var L = h.layer_ids.length, E = h.experts, cw = Math.max(2, Math.floor(512 / E));
    var ch = Math.max(4, Math.min(16, Math.floor(420 / L))); // a row tall enough for its label beside it
    canvas.width = E * cw; canvas.height = L * ch;
    var g = canvas.getContext("2d");
    var grid2 = mode === "residency" ? h.residency : h[mode];
    var max = 0;
    if (mode !== "residency") grid2.forEach(function (row) { row.forEach(function (v) { if (v > max) max = v; }); });
    for (var l = 0; l < L; l++) {
      for (var e = 0; e < E; e++) {
        var v = (grid2[l] || [])[e] || 0, color;
        if (mode === "residency") color = v === 1 ? "#59a14f" : v === 2 ? "#4e79a7" : "rgba(128,128,128,.15)";
        else if (!v || !max) color = "rgba(128,128,128,.12)";
        else {
          var x = Math.sqrt(v / max); // sqrt: a few hot experts do not wash out the rest
          color = mode === "hits" ? "hsl(" + (140 - 80 * x) + ",75%," + (25 + 45 * x) + "%)"
                                  : "hsl(" + (20 - 20 * x) + ",85%," + (25 + 45 * x) + "%)";
        }
        g.fillStyle = color;
        g.fillRect(e * cw, l * ch, cw - (cw > 3 ? 1 : 0), ch - 1);
      }
    }
    // per-layer hit rate beside the rows; the worst layers marked
    var rated = h.layer_hit_rate.map(function (r, i) { return [r, i]; }).filter(function (p) { return p[0] != null; });
    rated.sort(function (a, b) { return a[0] - b[0]; });
    var worst = {};
    // a quarter of the layers at most (3 on a deep model, 1 of 2 on a tiny one): "worst" must single some out
    rated.slice(0, Math.min(3, Math.max(1, Math.floor(rated.length / 4)))).forEach(function (p) { worst[p[1]] = true; });
    var ol = c.heat.rates;
    ol.textContent = "";
    var rowH = canvas.clientHeight / L;
    h.layer_ids.forEach(function (id, i) {
      var r = h.layer_hit_rate[i];
      var li = el("li", worst[i] ? "worst" : null);
      li.style.height = li.style.lineHeight = rowH + "px";
      li.style.fontSize = Math.max(6, Math.min(11, rowH - 2)) + "px";
      li.title = "layer " + id + (worst[i] ? " (among the worst)" : "");
      var barw = el("span", "rate");
      barw.style.width = (r == null ? 0 : 30 * r).toFixed(0) + "px";
      li.appendChild(el("span", null, "L" + id + " " + (r == null ? "—" : (100 * r).toFixed(0) + "%")));
      li.appendChild(barw);
      ol.appendChild(li);
    });
  }

  function redraw(c) {
    CHARTS.forEach(function (spec) { plot(c, spec[0]); });
    c.plots.hit.box.firstChild.textContent = "hit rate %" + (c.hist.hit.some(function (v) { return v != null; })
                                                            ? "" : " (no streamed experts yet)");
    live.points[c.node.dataset.worker] = c.hist.t.length;
  }

  function fill(worker, points) {
    // a worker's last two minutes (oldest first) in place of what its charts held
    var c = card(worker);
    c.hist = {t: []};
    CHARTS.forEach(function (spec) { c.hist[spec[0]] = []; });
    points.slice(-HISTORY).forEach(function (s) {
      if (c.hist.t.length && s.at <= c.hist.t[c.hist.t.length - 1]) return;
      c.hist.t.push(s.at);
      CHARTS.forEach(function (spec) { c.hist[spec[0]].push(spec[3](s)); });
    });
    redraw(c);
  }

  function update(s) {
    var c = card(s.worker), n = c.node, now = performance.now();
    live.messages++;
    live.perWorker[s.worker] = (live.perWorker[s.worker] || 0) + 1;
    if (live.first == null) live.first = now;
    live.last = now;
    var st = n.querySelector('[data-f="state"]');
    st.className = "state state-" + s.state;
    st.textContent = s.state + (s.state === "prefill" && s.prefill_total ? " " + s.prefill_done + "/" + s.prefill_total : "");
    setText(n, "loaded", (s.loaded || []).join(", ") || "—");
    setText(n, "queue", s.queue_depth ? s.queue_depth + ", oldest " + fmt(s.oldest_wait, 1) + " s" : "0");
    setText(n, "slots", (s.active || 0) + " of " + (s.parallel || 1));
    setText(n, "tps", fmt(s.tokens_per_s, 1));
    setText(n, "ttft", s.ttft == null ? "—" : fmt(s.ttft, 2) + " s");
    setText(n, "hit", s.expert_hit_rate == null ? "—" : fmt(100 * s.expert_hit_rate, 0) + " %");
    setText(n, "disk", fmt(s.disk_mb_per_s, 1) + " MB/s");
    setText(n, "cpu", fmt(s.cpu_percent, 0) + " % · load " + fmt(s.load_average, 2));
    var temps = Object.keys(s.temperatures || {}).map(function (k) { return k + " " + fmt(s.temperatures[k], 0) + " °C"; });
    var thermal = temps.join(", ") || "—";
    if (s.cpu_mhz) thermal += " · " + fmt(s.cpu_mhz, 0) + (s.cpu_max_mhz ? "/" + fmt(s.cpu_max_mhz, 0) : "") + " MHz";
    setText(n, "thermal", thermal);
    if (s.throttled) n.querySelector('[data-f="thermal"]').appendChild(el("b", "warn", " throttled"));
    membar(c, s.memory || {});
    var t = c.hist.t;
    if (!t.length || s.at > t[t.length - 1]) {
      t.push(s.at);
      CHARTS.forEach(function (spec) { c.hist[spec[0]].push(spec[3](s)); });
      if (t.length > HISTORY) Object.keys(c.hist).forEach(function (k) { c.hist[k].shift(); });
    }
    redraw(c);
    heatmap(c, s.heatmap);
    live.renders++;
    status.textContent = "live · " + new Date(s.at * 1000).toLocaleTimeString();
  }

  var history = JSON.parse(document.getElementById("live-history").textContent);
  JSON.parse(document.getElementById("initial-stats").textContent).forEach(function (s) {
    if (history[s.worker]) fill(s.worker, history[s.worker]);
    update(s);
  });
  live.messages = 0; live.first = null; // count only what the socket brings

  var retry = 500;
  function connect() {
    var ws = new WebSocket(location.protocol.replace("http", "ws") + "//" + location.host + "/ws/panel/live/");
    ws.onopen = function () { retry = 500; };
    ws.onmessage = function (m) {
      var msg = JSON.parse(m.data);
      if (msg.t === "history") fill(msg.worker, msg.points);
      else update(msg);
    };
    ws.onclose = function (e) {
      if (e.code === 4401) { // the session ended (webui/socket_auth.py): no reconnecting
        var link = el("a", null, "sign in again");
        link.href = "/login/?next=" + encodeURIComponent(location.pathname);
        status.replaceChildren("Signed out — ", link);
        return;
      }
      status.textContent = "disconnected; reconnecting…";
      setTimeout(connect, retry);
      retry = Math.min(retry * 2, 10000);
    };
  }
  connect();
})();
