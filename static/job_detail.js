/* The job page: refresh the live header and the charts while the job moves (GantryPoll:
 * every 3 s while the tab is visible, every 20 s when hidden); stops once the job has
 * ended and its run directory was read for the last time.
 *
 * Charts fetch at most one point per pixel of their width. Dragging across a step chart
 * zooms all of them to that step range, fetched from the metrics API for that range
 * (step_min/step_max, still at most one point per pixel); "Reset zoom" goes back.
 * The log tail, once shown, follows the file while the job runs (a Range request for the
 * bytes after the ones shown). */
(function () {
  "use strict";
  var root = document.getElementById("job-live");
  if (!root) return;
  var statusUrl = root.dataset.statusUrl, metricsUrl = root.dataset.metricsUrl, logsUrl = root.dataset.logsUrl;
  var outputUrl = root.dataset.outputUrl, ranksUrl = root.dataset.ranksUrl, rankUrl = root.dataset.rankUrl;
  var lastKey = null, zoom = null, lastData = null;

  function finalNow() {
    var status = document.getElementById("job-status");
    return status && status.dataset.final === "1";
  }

  function onZoom(lo, hi) { zoom = {lo: Math.max(0, Math.ceil(lo)), hi: Math.floor(hi)}; lastKey = null; refreshMetrics(); }
  function onReset() { zoom = null; lastKey = null; refreshMetrics(); }

  function drawCharts(data) {
    var note = document.getElementById("chart-note");
    if (note) {
      var text = data.count ? (data.count + " logged steps" + (zoom ? " in steps " + zoom.lo + "–" + zoom.hi : "") + (data.downsampled ? ", shown as " + data.step.length + " points (averaged per bucket, at most one per pixel)" : "")) : (zoom ? "No logged steps in steps " + zoom.lo + "–" + zoom.hi : "");
      note.textContent = text + (data.count ? ". Drag across a chart to zoom, hover for values." : "");
    }
    var s = data.series;
    var hl = [];
    if (data.optimal_loss !== null) hl.push({y: data.optimal_loss, label: "optimum", dash: "6 4"});
    if (data.target_loss !== null) hl.push({y: data.target_loss, label: "target", dash: "2 3"});
    var step = {integerX: true, xName: "step", onZoom: onZoom, onReset: onReset, zoomed: zoom !== null};
    function chart(id, spec) {
      var target = document.getElementById(id);
      if (!target) return;
      var full = {};
      for (var key in step) full[key] = step[key];
      for (var own in spec) full[own] = spec[own];
      GantryChart.line(target, full);
    }
    chart("chart-loss", {x: data.step, series: [{name: "loss", values: s.loss}], hlines: hl, xLabel: "step", empty: "No metrics yet: they appear when training starts"});
    var time = document.getElementById("chart-loss-time");
    if (time) GantryChart.line(time, {x: s.elapsed_s.map(function (v, i) { return v === null ? data.step[i] : v; }), series: [{name: "loss", values: s.loss}], hlines: hl, xLabel: "seconds since start", xName: "s"});
    chart("chart-throughput", {x: data.step, series: [{name: "samples/s", values: s.samples_per_s}, {name: "tokens/s ÷ 100", values: s.tokens_per_s.map(function (v) { return v === null ? null : v / 100; })}], xLabel: "step", zeroBased: true});
    chart("chart-steptime", {x: data.step, series: [{name: "step", values: s.step_time_s}, {name: "data", values: s.data_time_s}, {name: "checkpoint blocking", values: s.checkpoint_blocking_s}], xLabel: "step", zeroBased: true});
  }

  function metricsQuery() {
    var chart = document.getElementById("chart-loss");
    // At most one point per pixel (the API allows 10..2000).
    var points = Math.max(10, Math.min(2000, chart ? GantryChart.plotWidth(chart) : 500));
    var query = "?max_points=" + points;
    if (zoom) query += "&step_min=" + zoom.lo + "&step_max=" + zoom.hi;
    return query;
  }

  function refreshMetrics() {
    var query = metricsQuery();
    return fetch(metricsUrl + query, {credentials: "same-origin"}).then(function (r) { return r.json(); }).then(function (data) {
      var key = query + "|" + data.count + "|" + data.step.length;
      if (key !== lastKey) { lastKey = key; lastData = data; drawCharts(data); }
    });
  }

  function refreshStatus() {
    return GantryPoll.swap(statusUrl, "job-status").then(updateEta);
  }

  var rate = null, lastStep = null, lastTime = null;
  function updateEta() {
    var eta = document.getElementById("eta");
    if (!eta) return;
    var total = Number(eta.dataset.total), last = Number(eta.dataset.last), now = Date.now() / 1000;
    if (lastStep !== null && last > lastStep) {
      var r = (last - lastStep) / (now - lastTime);
      rate = rate === null ? r : 0.7 * rate + 0.3 * r;
    }
    if (lastStep === null || last !== lastStep) { lastStep = last; lastTime = now; }
    if (rate && last < total) eta.textContent = "· about " + Math.max(1, Math.round((total - last) / rate)) + " s left";
  }

  // ------------------------------------------------------------ the log tail

  var logSize = null, following = false;
  function followNote(text) { var note = document.getElementById("logs-follow"); if (note) note.textContent = text; }

  function appendLog(text) {
    var pre = document.getElementById("logs");
    var atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.textContent += text;
    if (atEnd) pre.scrollTop = pre.scrollHeight;
  }

  function followLog() {
    if (logSize === null) return Promise.resolve();
    // The bytes after those shown, at most 256 KiB per poll.
    return fetch(outputUrl, {credentials: "same-origin", headers: {Range: "bytes=" + logSize + "-" + (logSize + 262143)}}).then(function (r) {
      if (r.status === 206) {
        var range = /bytes (\d+)-(\d+)\/(\d+)/.exec(r.headers.get("Content-Range") || "");
        return r.text().then(function (text) {
          appendLog(text);
          if (range) logSize = Number(range[2]) + 1;
          followNote(finalNow() ? "" : "following the output while the job runs…");
        });
      }
      if (r.status === 416) { followNote(finalNow() ? "" : "following the output while the job runs…"); return; }
      if (r.status === 404) return;
      throw new Error("HTTP " + r.status);
    });
  }

  function showRanks() {
    var box = document.getElementById("rank-outputs");
    if (!box || !ranksUrl) return;
    fetch(ranksUrl, {credentials: "same-origin"}).then(function (r) { return r.ok ? r.json() : []; }).then(function (files) {
      box.innerHTML = "";
      if (!files.length) return;
      box.appendChild(document.createTextNode("Each rank: "));
      files.forEach(function (file, i) {
        var link = document.createElement("a");
        link.href = rankUrl.replace(/\/0\/$/, "/" + file.rank + "/");
        link.className = "rank-output";
        link.dataset.rank = file.rank;
        link.textContent = "rank " + file.rank + " (" + (file.size >= 1024 ? Math.round(file.size / 1024) + " KiB" : file.size + " B") + ")";
        if (i) box.appendChild(document.createTextNode(" · "));
        box.appendChild(link);
      });
    }).catch(function () {});
  }

  // The tail as a worker last read it (no web request reads the cluster for it): shown
  // with its age; while a newer read is on its way, asked again for a few seconds.
  function readNote(data) {
    var note = document.getElementById("logs-read-at");
    if (!note) return;
    if (data.error) { note.textContent = data.error + (data.read_at ? " (showing the read of " + new Date(data.read_at).toLocaleTimeString() + ")" : ""); return; }
    if (!data.read_at) { note.textContent = data.reading ? "reading the output on the cluster…" : ""; return; }
    note.textContent = "read " + new Date(data.read_at).toLocaleTimeString() + " (" + Math.round(data.age_s) + " s ago)" + (data.reading ? "; reading it again…" : "");
  }

  function loadTail(tries) {
    var pre = document.getElementById("logs");
    return fetch(logsUrl, {credentials: "same-origin"}).then(function (r) { return r.json(); }).then(function (data) {
      if (data.message) { pre.textContent = data.message; return; }
      readNote(data);
      if (data.read_at || !data.reading) {
        pre.textContent = (data.truncated ? "… (earlier output cut: download the whole output)\n" : "") + (data.text || "(no output yet)\n");
        pre.scrollTop = pre.scrollHeight;
      }
      if (data.reading && tries > 0) return new Promise(function (done) { setTimeout(done, 1000); }).then(function () { return loadTail(tries - 1); });
      logSize = data.path && data.read_at ? data.size : null;
      if (!finalNow() && !following && logSize !== null) {
        following = true;
        followNote("following the output while the job runs…");
        GantryPoll.every(function () {
          if (finalNow()) { return followLog().then(function () { followNote(""); return false; }); }
          return followLog();
        }, {visible: 3000, hidden: 20000});
      }
      showRanks();
    });
  }

  var logsButton = document.getElementById("load-logs");
  if (logsButton) logsButton.addEventListener("click", function () {
    var pre = document.getElementById("logs");
    pre.hidden = false;
    if (!pre.textContent) pre.textContent = "loading…";
    logsButton.textContent = "Refresh the end of the Slurm output";
    loadTail(20);
  });

  function tick() {
    return Promise.all([refreshStatus(), refreshMetrics()]).then(function () {
      if (!finalNow()) return true;
      return refreshMetrics().then(function () { return false; });
    });
  }
  window.addEventListener("resize", function () { lastKey = null; refreshMetrics(); });

  // Resuming from a checkpoint no drill has proven asks first.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form.classList && form.classList.contains("resume-form") && form.dataset.warn) {
      if (!window.confirm(form.dataset.warn)) event.preventDefault();
    }
  });

  window.GantryJob = {zoom: onZoom, reset: onReset, data: function () { return lastData; }};
  refreshMetrics().catch(function () {});
  updateEta();
  if (!finalNow()) GantryPoll.every(tick, {visible: 3000, hidden: 20000});
})();
