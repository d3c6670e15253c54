/* The study page: refresh the table while points run and draw the scaling charts.
 * Polls every 3 s while the tab is visible, 20 s when hidden; stops once every point ended.
 * Each chart downloads as a standalone SVG file. */
(function () {
  "use strict";
  var root = document.getElementById("study-live");
  if (!root) return;
  var statusUrl = root.dataset.statusUrl, reportUrl = root.dataset.reportUrl;
  var lastKey = null;

  function done() {
    var status = document.getElementById("study-status");
    return status && status.dataset.done === "1";
  }

  function column(rows, key) { return rows.map(function (r) { return r[key] === undefined ? null : r[key]; }); }

  function draw(report) {
    var rows = report.rows, ranks = column(rows, "ranks");
    var empty = "No measured point yet: figures appear as points finish";
    GantryChart.line(document.getElementById("chart-throughput"), {x: ranks, series: [
      {name: "measured samples/s", values: column(rows, "samples_per_s")},
      {name: "ideal (linear)", values: column(rows, "ideal_samples_per_s"), dash: "6 4"}
    ], xLabel: "ranks", integerX: true, xName: "ranks", zeroBased: true, empty: empty});
    GantryChart.line(document.getElementById("chart-speedup"), {x: ranks, series: [
      {name: "speed-up", values: column(rows, "speedup")},
      {name: "ideal", values: column(rows, "ideal_speedup"), dash: "6 4"}
    ], xLabel: "ranks", integerX: true, xName: "ranks", zeroBased: true, empty: empty});
    GantryChart.line(document.getElementById("chart-efficiency"), {x: ranks, series: [
      {name: "efficiency %", values: column(rows, "efficiency").map(function (v) { return v === null ? null : v * 100; })}
    ], hlines: [{y: 100, label: "ideal", dash: "6 4"}], xLabel: "ranks", integerX: true, xName: "ranks", zeroBased: true, empty: empty});
    GantryChart.line(document.getElementById("chart-breakdown"), {x: ranks, series: [
      {name: "step", values: column(rows, "step_time_s")},
      {name: "data", values: column(rows, "data_time_s")},
      {name: "compute (est.)", values: column(rows, "compute_s")},
      {name: "communication (est.)", values: column(rows, "communication_s")}
    ], xLabel: "ranks", integerX: true, xName: "ranks", zeroBased: true, empty: empty});
  }

  function refreshReport() {
    return fetch(reportUrl, {credentials: "same-origin"}).then(function (r) { return r.json(); }).then(function (data) {
      var key = JSON.stringify(data.report.rows);
      if (key !== lastKey) { lastKey = key; draw(data.report); }
    });
  }

  function tick() {
    return Promise.all([GantryPoll.swap(statusUrl, "study-status"), refreshReport()]).then(function () {
      if (!done()) return true;
      return refreshReport().then(function () { return false; });
    });
  }
  window.addEventListener("resize", function () { lastKey = null; refreshReport(); });

  // A standalone SVG: the drawn element with its namespace and the page's chart styles inlined.
  function svgText(chartId) {
    var svg = document.querySelector("#" + chartId + " svg");
    if (!svg) return null;
    var copy = svg.cloneNode(true);
    copy.setAttribute("xmlns", "http://www.w3.org/2000/svg");
    var box = svg.getBoundingClientRect();
    copy.setAttribute("width", Math.round(box.width));
    copy.setAttribute("height", Math.round(box.height));
    var style = document.createElementNS("http://www.w3.org/2000/svg", "style");
    style.textContent = "text{font:11px sans-serif;fill:#374151}.chart-grid{stroke:#e5e7eb}.chart-tick{stroke:#9ca3af}.chart-hline{stroke:#6b7280}";
    copy.insertBefore(style, copy.firstChild);
    return new XMLSerializer().serializeToString(copy);
  }
  document.addEventListener("click", function (event) {
    var link = event.target.closest && event.target.closest(".svg-download");
    if (!link) return;
    event.preventDefault();
    var text = svgText(link.dataset.chart);
    if (!text) return;
    var a = document.createElement("a");
    a.href = URL.createObjectURL(new Blob([text], {type: "image/svg+xml"}));
    a.download = "study-" + root.dataset.statusUrl.split("/").filter(Boolean).slice(-2, -1)[0] + "-" + link.dataset.name + ".svg";
    document.body.appendChild(a);
    a.click();
    setTimeout(function () { URL.revokeObjectURL(a.href); a.remove(); }, 1000);
  });
  window.GantryStudy = {svgText: svgText};

  refreshReport().catch(function () {});
  if (!done()) GantryPoll.every(tick, {visible: 3000, hidden: 20000});
})();
