/* The submit form: partition and GPU type selects follow the chosen cluster and partition
 * (from the synced inventory the page carries), the numbers carry the partition's bounds,
 * and as you type the form is checked by the server (the same validation as submit and the
 * API, debounced), which also sends the placement advice, the exact sbatch script, the
 * presets' step time on the partition and the checkpoint-interval advice shown beside it. */
(function () {
  "use strict";
  var form = document.getElementById("job-form");
  var raw = document.getElementById("inventory-data");
  if (!form || !raw) return;
  var inventory = JSON.parse(raw.textContent);
  var checkUrl = form.dataset.checkUrl;
  var field = function (name) { return form.elements.namedItem(name); };
  var sequence = 0, timer = null;

  function plural(n, word) { return n + " " + word + (n === 1 ? "" : "s"); }

  function partitionLabel(p) {
    var types = p.gpu_types.map(function (t) { return t.name + " ×" + t.max_per_node + "/node"; });
    return p.name + " — " + plural(p.nodes, "node") + ", " + p.idle_nodes + " idle · " + (types.length ? types.join(", ") : "no GPUs");
  }

  function gpuTypeLabel(t) {
    return t.name + " — " + t.per_node.map(function (e) { return e.gpus + " per node on " + plural(e.nodes, "node"); }).join(", ");
  }

  function cluster() {
    var id = String(field("cluster").value);
    return inventory.filter(function (c) { return String(c.id) === id; })[0] || null;
  }

  function partition() {
    var c = cluster(), name = field("partition").value;
    if (!c) return null;
    return c.partitions.filter(function (p) { return p.name === name; })[0] || null;
  }

  function setOptions(select, options, wanted) {
    select.innerHTML = "";
    options.forEach(function (o) {
      var option = document.createElement("option");
      option.value = o[0];
      option.textContent = o[1];
      select.appendChild(option);
    });
    var values = options.map(function (o) { return o[0]; });
    select.value = values.indexOf(wanted) >= 0 ? wanted : (values[0] || "");
  }

  function fillPartitions(keep) {
    var c = cluster(), select = field("partition");
    var partitions = c ? c.partitions : [];
    var wanted = keep ? select.value : (c && c.default_partition) || "";
    setOptions(select, partitions.map(function (p) { return [p.name, partitionLabel(p)]; }), wanted);
    fillGpuTypes(true);
  }

  function fillGpuTypes(keep) {
    var p = partition(), select = field("gpu_type");
    var types = p ? p.gpu_types : [];
    var options = [["", types.length ? "any type" : "no GPUs in this partition"]];
    types.forEach(function (t) { options.push([t.name, gpuTypeLabel(t)]); });
    setOptions(select, options, keep ? select.value : "");
    bounds();
  }

  function bounds() {
    var p = partition(), summary = document.getElementById("partition-summary");
    if (!p) { if (summary) summary.textContent = ""; return; }
    var type = field("gpu_type").value, gpus = p.max_gpus_per_node;
    p.gpu_types.forEach(function (t) { if (t.name === type) gpus = t.max_per_node; });
    var limits = {nodes: p.nodes, gpus_per_node: gpus, cpus_per_task: p.max_cpus_per_node, memory_mb: p.max_memory_mb, time_limit_minutes: p.max_time_minutes};
    Object.keys(limits).forEach(function (name) {
      var input = field(name);
      if (!input) return;
      if (limits[name]) input.setAttribute("max", limits[name]); else input.removeAttribute("max");
    });
    if (summary) {
      summary.textContent = plural(p.nodes, "node") + " (" + p.idle_nodes + " idle, " + p.usable_nodes + " usable), up to " +
        p.max_cpus_per_node + " CPUs, " + p.max_memory_mb + " MB and " + plural(p.max_gpus_per_node, "GPU") + " per node" +
        (p.max_time_minutes ? ", at most " + p.max_time_minutes + " min" : "") + ".";
    }
  }

  // ------------------------------------------------------------ the live check

  function showErrors(errors) {
    Array.prototype.forEach.call(form.querySelectorAll(".field[data-field]"), function (box) {
      var name = box.dataset.field, messages = errors[name];
      var shown = box.querySelector(".field-error");
      if (messages && messages.length) {
        if (!shown) {
          shown = document.createElement("div");
          shown.className = "field-error";
          shown.setAttribute("role", "alert");
          var help = box.querySelector(".help");
          box.insertBefore(shown, help);
        }
        shown.textContent = messages.join(" ");
        box.classList.add("has-error");
      } else {
        if (shown) shown.remove();
        box.classList.remove("has-error");
      }
    });
    var top = form.querySelector(".form-error");
    var general = errors.__all__ || [];
    if (general.length) {
      if (!top) {
        top = document.createElement("div");
        top.className = "form-error";
        top.setAttribute("role", "alert");
        form.insertBefore(top, form.querySelector(".form-grid"));
      }
      top.textContent = general.join(" ");
    } else if (top) {
      top.remove();
    }
  }

  function text(tag, content, className) {
    var node = document.createElement(tag);
    node.textContent = content;
    if (className) node.className = className;
    return node;
  }

  function showAdvice(advice) {
    var box = document.getElementById("placement-advice");
    if (!box) return;
    box.innerHTML = "";
    box.appendChild(text("h2", "Placement advice"));
    if (!advice) { box.appendChild(text("p", "Appears once the request is one the cluster can run.", "muted")); return; }
    box.dataset.feasible = advice.feasible ? "1" : "0";
    var explanation = text("p", advice.explanation);
    explanation.dataset.testid = "advice-explanation";
    box.appendChild(explanation);
    if (advice.feasible) {
      var list = document.createElement("dl");
      list.className = "kv compact";
      [["Nodes", advice.nodelist, "advice-nodes"], ["Switches spanned", (advice.switches_spanned.join(", ") || "–") + " (" + advice.switch_count + "; the fewest possible is " + advice.optimal_switch_count + ")", "advice-switches"], ["Slurm options", advice.sbatch_args.join(" "), ""]].forEach(function (row) {
        list.appendChild(text("dt", row[0]));
        var value = text("dd", row[1]);
        if (row[2]) value.dataset.testid = row[2];
        list.appendChild(value);
      });
      box.appendChild(list);
    }
  }

  function showPresets(presets) {
    (presets || []).forEach(function (p) {
      var cell = document.querySelector("#preset-table tr[data-preset='" + p.name + "'] [data-testid=step-time]");
      if (!cell) return;
      cell.innerHTML = "";
      if (p.step_time_s === null) {
        cell.appendChild(document.createTextNode("unknown "));
        cell.appendChild(text("span", "no past job with this preset on " + (p.partition || "this partition"), "muted small"));
      } else {
        cell.appendChild(document.createTextNode(p.step_time_s.toFixed(3) + " s "));
        cell.appendChild(text("span", "median of " + plural(p.step_time_jobs, "past job") + " on " + p.partition, "muted small"));
      }
    });
  }

  function showCheckpointAdvice(advice) {
    var box = document.getElementById("checkpoint-advice-text");
    if (!box) return;
    box.textContent = advice ? advice.words : "Choose a cluster and partition.";
    box.classList.toggle("muted", !advice || !advice.history);
  }

  function show(body) {
    showErrors(body.errors || {});
    var problems = Object.keys(body.errors || {}).length;
    var status = document.getElementById("live-status");
    if (status) status.textContent = body.ok ? "The cluster can run this." : plural(problems, "problem") + " to fix (marked in red).";
    var script = document.getElementById("sbatch-preview");
    if (script) script.textContent = body.script || "The script appears once the problems marked in red are fixed.";
    showAdvice(body.advice);
    showPresets(body.presets);
    showCheckpointAdvice(body.checkpoint_advice);
  }

  function check() {
    var mine = ++sequence;
    var data = new FormData(form);
    data.delete("action");
    var status = document.getElementById("live-status");
    if (status) status.textContent = "checking…";
    return fetch(checkUrl, {method: "POST", body: data, credentials: "same-origin", headers: {"X-Requested-With": "fetch"}})
      .then(function (response) { if (!response.ok) throw new Error("HTTP " + response.status); return response.json(); })
      .then(function (body) { if (mine === sequence) show(body); })
      .catch(function () { if (mine === sequence && status) status.textContent = "could not check just now"; });
  }

  function soon() {
    clearTimeout(timer);
    timer = setTimeout(check, 350);
  }

  field("cluster").addEventListener("change", function () { fillPartitions(false); });
  field("partition").addEventListener("change", function () { fillGpuTypes(true); });
  field("gpu_type").addEventListener("change", bounds);
  form.addEventListener("input", soon);
  form.addEventListener("change", soon);

  bounds();
  window.GantryJobForm = {check: check};
  check();
})();
