/* The drill page: poll the status while the drill runs, then reload once for the evidence. */
(function () {
  "use strict";
  var raw = document.getElementById("drill-chart-data");
  if (raw) {
    var data = JSON.parse(raw.textContent);
    var el = document.getElementById("chart-drill");
    if (el && data.step.length) {
      GantryChart.line(el, {x: data.step, series: [{name: "original run", values: data.reference, color: "#9ca3af"}, {name: "drill", values: data.drill, color: "#2563eb", dash: "5 3"}], xLabel: "step", integerX: true, xName: "step"});
    }
  }
  var live = document.getElementById("drill-live");
  if (!live) return;
  var status = document.getElementById("drill-status");
  if (status && status.dataset.final === "1") return;
  GantryPoll.every(function () {
    return GantryPoll.swap(live.dataset.statusUrl, "drill-status").then(function (fresh) {
      if (fresh && fresh.dataset.final === "1") { window.location.reload(); return false; }
      return true;
    });
  }, {visible: 2000, hidden: 15000});
})();
