/* The job page: refresh the live header and the charts while the job moves (GantryPoll:
 * every 3 s while the tab is visible, every 20 s when hidden); stops once the job has
 * ended and its run directory was read for the last time. */
(function () {
  "use strict";
  var root = document.getElementById("job-live");
  if (!root) return;
  var statusUrl = root.dataset.statusUrl, metricsUrl = root.dataset.metricsUrl, logsUrl = root.dataset.logsUrl;
  var lastCount = -1;

  function finalNow() {
    var status = document.getElementById("job-status");
    return status && status.dataset.final === "1";
  }

  function drawCharts(data) {
    var note = document.getElementById("chart-note");
    if (note) {
      note.textContent = data.count ? (data.count + " logged steps" + (data.downsampled ? ", shown as " + data.step.length + " points (averaged per bucket)" : "")) : "";
    }
    var s = data.series;
    var hl = [];
    if (data.optimal_loss !== null) hl.push({y: data.optimal_loss, label: "optimum", dash: "6 4"});
    if (data.target_loss !== null) hl.push({y: data.target_loss, label: "target", dash: "2 3"});
    GantryChart.line(document.getElementById("chart-loss"), {x: data.step, series: [{name: "loss", values: s.loss}], hlines: hl, xLabel: "step", empty: "No metrics yet: they appear when training starts"});
    GantryChart.line(document.getElementById("chart-loss-time"), {x: s.elapsed_s.map(function (v, i) { return v === null ? data.step[i] : v; }), series: [{name: "loss", values: s.loss}], hlines: hl, xLabel: "seconds since start"});
    GantryChart.line(document.getElementById("chart-throughput"), {x: data.step, series: [{name: "samples/s", values: s.samples_per_s}, {name: "tokens/s ÷ 100", values: s.tokens_per_s.map(function (v) { return v === null ? null : v / 100; })}], xLabel: "step", zeroBased: true});
    GantryChart.line(document.getElementById("chart-steptime"), {x: data.step, series: [{name: "step", values: s.step_time_s}, {name: "data", values: s.data_time_s}, {name: "checkpoint blocking", values: s.checkpoint_blocking_s}], xLabel: "step", zeroBased: true});
  }

  function refreshMetrics() {
    return fetch(metricsUrl, {credentials: "same-origin"}).then(function (r) { return r.json(); }).then(function (data) {
      if (data.count !== lastCount) { lastCount = data.count; drawCharts(data); }
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

  function tick() {
    return Promise.all([refreshStatus(), refreshMetrics()]).then(function () {
      if (!finalNow()) return true;
      return refreshMetrics().then(function () { return false; });
    });
  }
  window.addEventListener("resize", function () { lastCount = -1; refreshMetrics(); });

  var logsButton = document.getElementById("load-logs");
  if (logsButton) logsButton.addEventListener("click", function () {
    var pre = document.getElementById("logs");
    pre.hidden = false;
    pre.textContent = "loading…";
    fetch(logsUrl, {credentials: "same-origin"}).then(function (r) { return r.json(); }).then(function (data) {
      if (data.message) { pre.textContent = data.message; return; }
      pre.textContent = (data.truncated ? "… (earlier output cut)\n" : "") + (data.text || "(no output yet)");
      pre.scrollTop = pre.scrollHeight;
    });
  });

  // Resuming from a checkpoint no drill has proven asks first.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form.classList && form.classList.contains("resume-form") && form.dataset.warn) {
      if (!window.confirm(form.dataset.warn)) event.preventDefault();
    }
  });

  refreshMetrics().catch(function () {});
  updateEta();
  if (!finalNow()) GantryPoll.every(tick, {visible: 3000, hidden: 20000});
})();
