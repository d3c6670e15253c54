/* Gantry charts: small SVG line charts, no dependencies.
 * GantryChart.line(element, {x: [..], series: [{name, values, color, dash}], hlines: [{y, label, dash}],
 *                            xLabel, yLabel, logY})
 */
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var PALETTE = ["#2563eb", "#f59e0b", "#16a34a", "#dc2626", "#7c3aed", "#0891b2"];

  function el(name, attrs, parent) {
    var node = document.createElementNS(NS, name);
    for (var key in attrs) node.setAttribute(key, attrs[key]);
    if (parent) parent.appendChild(node);
    return node;
  }

  function niceTicks(lo, hi, count) {
    if (!isFinite(lo) || !isFinite(hi)) return [];
    if (hi === lo) { hi = lo + 1; }
    var span = hi - lo, step = Math.pow(10, Math.floor(Math.log10(span / count)));
    var err = (count * step) / span;
    if (err <= 0.15) step *= 10; else if (err <= 0.35) step *= 5; else if (err <= 0.75) step *= 2;
    var ticks = [], start = Math.ceil(lo / step) * step;
    for (var v = start; v <= hi + step * 1e-9; v += step) ticks.push(Number(v.toPrecision(12)));
    return ticks;
  }

  function fmt(v) {
    var a = Math.abs(v);
    if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(0) + "k";
    if (a >= 100) return v.toFixed(0);
    if (a >= 1) return v.toFixed(2).replace(/\.?0+$/, "");
    if (a === 0) return "0";
    return v.toPrecision(2);
  }

  function line(container, spec) {
    container.innerHTML = "";
    var width = container.clientWidth || 520, height = container.clientHeight || 240;
    var m = {left: 54, right: 12, top: 10, bottom: 34};
    var svg = el("svg", {viewBox: "0 0 " + width + " " + height, width: "100%", height: height, role: "img"}, container);
    var xs = spec.x || [];
    var all = [];
    (spec.series || []).forEach(function (s) { s.values.forEach(function (v) { if (v !== null && isFinite(v)) all.push(v); }); });
    (spec.hlines || []).forEach(function (h) { if (h.y !== null && isFinite(h.y)) all.push(h.y); });
    if (!xs.length || !all.length) {
      el("text", {x: width / 2, y: height / 2, "text-anchor": "middle", class: "chart-empty"}, svg).textContent = spec.empty || "No data yet";
      return svg;
    }
    var xlo = Math.min.apply(null, xs), xhi = Math.max.apply(null, xs);
    var ylo = Math.min.apply(null, all), yhi = Math.max.apply(null, all);
    var pad = (yhi - ylo) * 0.06 || Math.abs(yhi) * 0.1 || 1;
    ylo -= pad; yhi += pad;
    if (spec.zeroBased && ylo > 0) ylo = 0;
    if (xhi === xlo) xhi = xlo + 1;
    var pw = width - m.left - m.right, ph = height - m.top - m.bottom;
    function X(v) { return m.left + ((v - xlo) / (xhi - xlo)) * pw; }
    function Y(v) { return m.top + ph - ((v - ylo) / (yhi - ylo)) * ph; }
    var axis = el("g", {class: "chart-axis"}, svg);
    niceTicks(ylo, yhi, 5).forEach(function (t) {
      el("line", {x1: m.left, x2: width - m.right, y1: Y(t), y2: Y(t), class: "chart-grid"}, axis);
      el("text", {x: m.left - 6, y: Y(t) + 4, "text-anchor": "end"}, axis).textContent = fmt(t);
    });
    niceTicks(xlo, xhi, 6).forEach(function (t) {
      el("line", {x1: X(t), x2: X(t), y1: m.top + ph, y2: m.top + ph + 4, class: "chart-tick"}, axis);
      el("text", {x: X(t), y: m.top + ph + 16, "text-anchor": "middle"}, axis).textContent = fmt(t);
    });
    el("line", {x1: m.left, x2: width - m.right, y1: m.top + ph, y2: m.top + ph, class: "chart-tick"}, axis);
    if (spec.xLabel) el("text", {x: m.left + pw / 2, y: height - 4, "text-anchor": "middle", class: "chart-label"}, axis).textContent = spec.xLabel;
    (spec.hlines || []).forEach(function (h, i) {
      if (h.y === null || !isFinite(h.y)) return;
      el("line", {x1: m.left, x2: width - m.right, y1: Y(h.y), y2: Y(h.y), class: "chart-hline", "stroke-dasharray": h.dash || "6 4"}, svg);
      // Alternate sides, so two close lines keep readable labels.
      var right = i % 2 === 0;
      el("text", {x: right ? width - m.right - 4 : m.left + 4, y: Y(h.y) + (right ? -4 : 12), "text-anchor": right ? "end" : "start", class: "chart-hline-label"}, svg).textContent = h.label + " " + fmt(h.y);
    });
    var legend = el("g", {class: "chart-legend"}, svg), lx = m.left + 8;
    (spec.series || []).forEach(function (s, i) {
      var color = s.color || PALETTE[i % PALETTE.length];
      var points = [];
      for (var k = 0; k < xs.length; k++) {
        var v = s.values[k];
        if (v === null || v === undefined || !isFinite(v)) continue;
        points.push(X(xs[k]).toFixed(1) + "," + Y(v).toFixed(1));
      }
      el("polyline", {points: points.join(" "), fill: "none", stroke: color, "stroke-width": 1.6, "stroke-dasharray": s.dash || "", class: "chart-series", "data-series": s.name, "data-points": points.length}, svg);
      if ((spec.series || []).length > 1) {
        el("rect", {x: lx, y: m.top + 4, width: 10, height: 10, fill: color}, legend);
        var label = el("text", {x: lx + 14, y: m.top + 13}, legend);
        label.textContent = s.name;
        lx += 24 + s.name.length * 6.5;
      }
    });
    return svg;
  }

  window.GantryChart = {line: line, format: fmt};
})();
