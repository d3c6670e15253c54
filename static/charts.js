/* Gantry charts: small SVG line charts, no dependencies.
 *
 * GantryChart.line(element, {x: [..], series: [{name, values, color, dash}],
 *                            hlines: [{y, label, dash}], xLabel, zeroBased, empty,
 *                            integerX, xName, onZoom(lo, hi), onReset, zoomed})
 *
 * - integerX: the x axis counts things (steps, ranks): ticks at whole numbers only, and
 *   whole numbers in the hover read-out.
 * - Hover: a vertical line at the nearest point and a read-out of x and every series there.
 * - Zoom: drag across the plot to choose an x range; double-click or "Reset zoom" goes
 *   back. With onZoom the page fetches that range itself (onZoom(lo, hi); `zoomed` says
 *   it is showing one, which draws the reset button that calls onReset); without, the
 *   chart zooms into the points it has.
 * GantryChart.plotWidth(element): the plot's width in pixels (fetch at most that many
 * points: one per pixel).
 */
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var PALETTE = ["#2563eb", "#f59e0b", "#16a34a", "#dc2626", "#7c3aed", "#0891b2"];
  var MARGIN = {left: 54, right: 12, top: 10, bottom: 34};
  // The drag in progress (one at a time): released anywhere on the page, it ends there.
  var dragging = null;
  window.addEventListener("mouseup", function (event) {
    var finish = dragging;
    dragging = null;
    if (finish) finish(event);
  });

  function el(name, attrs, parent) {
    var node = document.createElementNS(NS, name);
    for (var key in attrs) node.setAttribute(key, attrs[key]);
    if (parent) parent.appendChild(node);
    return node;
  }

  function niceTicks(lo, hi, count, integer) {
    if (!isFinite(lo) || !isFinite(hi)) return [];
    if (hi === lo) { hi = lo + 1; }
    var span = hi - lo, step = Math.pow(10, Math.floor(Math.log10(span / count)));
    var err = (count * step) / span;
    if (err <= 0.15) step *= 10; else if (err <= 0.35) step *= 5; else if (err <= 0.75) step *= 2;
    if (integer) step = Math.max(1, Math.round(step));
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

  function fmtInt(v) { return Math.round(v).toLocaleString("en-US"); }

  function fmtValue(v) {
    if (v === null || v === undefined || !isFinite(v)) return "–";
    var a = Math.abs(v);
    if (a !== 0 && (a >= 1e6 || a < 1e-3)) return v.toExponential(3);
    return Number(v.toPrecision(5)).toLocaleString("en-US", {maximumFractionDigits: 6});
  }

  function plotWidth(container) {
    return Math.max(10, Math.floor((container.clientWidth || 520) - MARGIN.left - MARGIN.right));
  }

  // The chart's own zoom (without onZoom): keep the points inside [lo, hi].
  function clip(spec, zoom) {
    if (!zoom) return spec;
    var keep = [];
    spec.x.forEach(function (v, i) { if (v >= zoom.lo && v <= zoom.hi) keep.push(i); });
    var copy = {};
    for (var key in spec) copy[key] = spec[key];
    copy.x = keep.map(function (i) { return spec.x[i]; });
    copy.series = (spec.series || []).map(function (s) {
      var c = {};
      for (var k in s) c[k] = s[k];
      c.values = keep.map(function (i) { return s.values[i]; });
      return c;
    });
    copy.zoomed = true;
    return copy;
  }

  function nearest(xs, value) {
    var best = 0, gap = Infinity;
    for (var i = 0; i < xs.length; i++) {
      var d = Math.abs(xs[i] - value);
      if (d < gap) { gap = d; best = i; }
    }
    return best;
  }

  function line(container, given) {
    var own = !given.onZoom;
    var spec = own ? clip(given, container.gantryZoom) : given;
    container.innerHTML = "";
    container.classList.add("chart-wrap");
    var width = container.clientWidth || 520, height = container.clientHeight || 240;
    var m = MARGIN;
    var svg = el("svg", {viewBox: "0 0 " + width + " " + height, width: "100%", height: height, role: "img"}, container);
    var xs = spec.x || [];
    var all = [];
    (spec.series || []).forEach(function (s) { s.values.forEach(function (v) { if (v !== null && isFinite(v)) all.push(v); }); });
    (spec.hlines || []).forEach(function (h) { if (h.y !== null && isFinite(h.y)) all.push(h.y); });
    if (!xs.length || !all.length) {
      el("text", {x: width / 2, y: height / 2, "text-anchor": "middle", class: "chart-empty"}, svg).textContent = spec.empty || "No data yet";
      if (spec.zoomed) resetButton(container, given, own);
      return svg;
    }
    var xlo = Math.min.apply(null, xs), xhi = Math.max.apply(null, xs);
    var ylo = Math.min.apply(null, all), yhi = Math.max.apply(null, all);
    var pad = (yhi - ylo) * 0.06 || Math.abs(yhi) * 0.1 || 1;
    ylo -= pad; yhi += pad;
    if (spec.zeroBased && ylo > 0) ylo = 0;
    if (xhi === xlo) xhi = xlo + 1;
    svg.dataset.xMin = xlo;
    svg.dataset.xMax = xhi;
    var pw = width - m.left - m.right, ph = height - m.top - m.bottom;
    function X(v) { return m.left + ((v - xlo) / (xhi - xlo)) * pw; }
    function Y(v) { return m.top + ph - ((v - ylo) / (yhi - ylo)) * ph; }
    function unX(px) { return xlo + ((px - m.left) / pw) * (xhi - xlo); }
    var axis = el("g", {class: "chart-axis"}, svg);
    niceTicks(ylo, yhi, 5, false).forEach(function (t) {
      el("line", {x1: m.left, x2: width - m.right, y1: Y(t), y2: Y(t), class: "chart-grid"}, axis);
      el("text", {x: m.left - 6, y: Y(t) + 4, "text-anchor": "end"}, axis).textContent = fmt(t);
    });
    niceTicks(xlo, xhi, 6, spec.integerX).forEach(function (t) {
      el("line", {x1: X(t), x2: X(t), y1: m.top + ph, y2: m.top + ph + 4, class: "chart-tick"}, axis);
      el("text", {x: X(t), y: m.top + ph + 16, "text-anchor": "middle", class: "chart-x-tick"}, axis).textContent = spec.integerX ? fmtInt(t) : fmt(t);
    });
    el("line", {x1: m.left, x2: width - m.right, y1: m.top + ph, y2: m.top + ph, class: "chart-tick"}, axis);
    if (spec.xLabel) el("text", {x: m.left + pw / 2, y: height - 4, "text-anchor": "middle", class: "chart-label"}, axis).textContent = spec.xLabel + (spec.zoomed ? " (zoomed: drag to zoom further, double-click to reset)" : "");
    (spec.hlines || []).forEach(function (h, i) {
      if (h.y === null || !isFinite(h.y)) return;
      el("line", {x1: m.left, x2: width - m.right, y1: Y(h.y), y2: Y(h.y), class: "chart-hline", "stroke-dasharray": h.dash || "6 4"}, svg);
      // Alternate sides, so two close lines keep readable labels.
      var right = i % 2 === 0;
      el("text", {x: right ? width - m.right - 4 : m.left + 4, y: Y(h.y) + (right ? -4 : 12), "text-anchor": right ? "end" : "start", class: "chart-hline-label"}, svg).textContent = h.label + " " + fmt(h.y);
    });
    var legend = el("g", {class: "chart-legend"}, svg), lx = m.left + 8;
    var colors = [];
    (spec.series || []).forEach(function (s, i) {
      var color = s.color || PALETTE[i % PALETTE.length];
      colors.push(color);
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
    interact(container, svg, given, spec, {X: X, Y: Y, unX: unX, m: m, pw: pw, ph: ph, height: height, colors: colors, own: own});
    if (spec.zoomed) resetButton(container, given, own);
    return svg;
  }

  function resetButton(container, given, own) {
    var button = document.createElement("button");
    button.type = "button";
    button.className = "small-button chart-reset";
    button.textContent = "Reset zoom";
    button.style.position = "absolute";
    button.style.right = "14px";
    button.style.top = "2px";
    button.addEventListener("click", function () { reset(container, given, own); });
    container.appendChild(button);
  }

  function reset(container, given, own) {
    if (own) { container.gantryZoom = null; line(container, given); }
    else if (given.onReset) given.onReset();
  }

  function interact(container, svg, given, spec, geo) {
    var xs = spec.x, hover = el("g", {class: "chart-hover", visibility: "hidden"}, svg);
    var rule = el("line", {y1: geo.m.top, y2: geo.m.top + geo.ph, class: "chart-hover-line"}, hover);
    var dots = (spec.series || []).map(function (s, i) { return el("circle", {r: 3, fill: geo.colors[i], class: "chart-hover-dot"}, hover); });
    var selection = el("rect", {y: geo.m.top, height: geo.ph, width: 0, class: "chart-selection", visibility: "hidden"}, svg);
    var tip = document.createElement("div");
    tip.className = "chart-tip";
    tip.hidden = true;
    container.appendChild(tip);
    var dragFrom = null;

    function local(event) {
      var box = svg.getBoundingClientRect();
      var scale = box.width ? (svg.viewBox.baseVal.width / box.width) : 1;
      return {x: (event.clientX - box.left) * scale, y: (event.clientY - box.top) * scale, scale: scale};
    }
    function inside(p) { return p.x >= geo.m.left && p.x <= geo.m.left + geo.pw; }

    function show(p) {
      var i = nearest(xs, geo.unX(p.x)), x = geo.X(xs[i]);
      hover.setAttribute("visibility", "visible");
      rule.setAttribute("x1", x); rule.setAttribute("x2", x);
      var rows = [(spec.xName || spec.xLabel || "x") + " " + (spec.integerX ? fmtInt(xs[i]) : fmtValue(xs[i]))];
      (spec.series || []).forEach(function (s, k) {
        var v = s.values[i];
        if (v === null || v === undefined || !isFinite(v)) { dots[k].setAttribute("visibility", "hidden"); }
        else { dots[k].setAttribute("visibility", "visible"); dots[k].setAttribute("cx", x); dots[k].setAttribute("cy", geo.Y(v)); }
        rows.push(s.name + ": " + fmtValue(v));
      });
      tip.innerHTML = "";
      rows.forEach(function (row, n) {
        var part = document.createElement(n === 0 ? "b" : "div");
        part.textContent = row;
        tip.appendChild(part);
      });
      tip.hidden = false;
      tip.dataset.index = i;
      var left = x / p.scale + 12, width = container.clientWidth || 520;
      tip.style.left = (left + 160 > width ? Math.max(0, left - 180) : left) + "px";
      tip.style.top = (geo.m.top / p.scale + 4) + "px";
    }
    function hide() { hover.setAttribute("visibility", "hidden"); tip.hidden = true; }

    svg.addEventListener("mousemove", function (event) {
      var p = local(event);
      if (dragFrom !== null) {
        var a = Math.max(geo.m.left, Math.min(dragFrom, p.x)), b = Math.min(geo.m.left + geo.pw, Math.max(dragFrom, p.x));
        selection.setAttribute("visibility", "visible");
        selection.setAttribute("x", a); selection.setAttribute("width", Math.max(0, b - a));
      }
      if (inside(p)) show(p); else hide();
    });
    svg.addEventListener("mouseleave", function () { hide(); });
    svg.addEventListener("mousedown", function (event) {
      var p = local(event);
      if (!inside(p) || event.button !== 0) return;
      event.preventDefault();
      dragFrom = p.x;
      dragging = finish;
    });
    function finish(event) {
      if (dragFrom === null) return;
      var p = local(event), from = dragFrom;
      dragFrom = null;
      selection.setAttribute("visibility", "hidden");
      if (Math.abs(p.x - from) < 6) return;
      var lo = geo.unX(Math.max(geo.m.left, Math.min(from, p.x))), hi = geo.unX(Math.min(geo.m.left + geo.pw, Math.max(from, p.x)));
      if (spec.integerX) { lo = Math.ceil(lo); hi = Math.floor(hi); }
      if (!(hi > lo)) return;
      zoomTo(container, given, lo, hi);
    }
    svg.addEventListener("dblclick", function () { if (spec.zoomed) reset(container, given, geo.own); });
  }

  function zoomTo(container, given, lo, hi) {
    if (given.onZoom) { given.onZoom(lo, hi); return; }
    container.gantryZoom = {lo: lo, hi: hi};
    line(container, given);
  }

  window.GantryChart = {line: line, format: fmt, plotWidth: plotWidth, zoomTo: zoomTo, ticks: niceTicks};
})();
