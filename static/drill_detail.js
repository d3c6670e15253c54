/* The drill page: poll the status while the drill runs, then reload once for the evidence. */
(function () {
  "use strict";
  var raw = document.getElementById("drill-chart-data");
  if (raw) {
    var data = JSON.parse(raw.textContent);
    var el = document.getElementById("chart-drill");
    if (el && data.step.length) {
      GantryChart.line(el, {x: data.step, series: [{name: "original run", values: data.reference, color: "#9ca3af"}, {name: "drill", values: data.drill, color: "#2563eb", dash: "5 3"}], xLabel: "step"});
    }
  }
  var live = document.getElementById("drill-live");
  if (!live) return;
  var status = document.getElementById("drill-status");
  if (status && status.dataset.final === "1") return;
  function tick() {
    fetch(live.dataset.statusUrl, {credentials: "same-origin"}).then(function (r) { return r.text(); }).then(function (html) {
      var holder = document.createElement("div");
      holder.innerHTML = html;
      var fresh = holder.querySelector("#drill-status");
      if (fresh && fresh.dataset.final === "1") { window.location.reload(); return; }
      if (fresh) document.getElementById("drill-status").replaceWith(fresh);
      setTimeout(tick, document.hidden ? 15000 : 2000);
    }).catch(function () { setTimeout(tick, 5000); });
  }
  setTimeout(tick, 2000);
})();
