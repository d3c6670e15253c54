/* The one poller of every live page (job, drill, study, overview, nodes).
 *
 * GantryPoll.every(tick, {visible: ms, hidden: ms}) calls tick() (which returns a Promise
 * or nothing) now and again: every `visible` ms while the tab is shown, every `hidden`
 * ms while it is hidden, at once when the tab comes back; a failing tick backs off
 * (doubling, up to 60 s). tick() returning or resolving to false stops the polling.
 *
 * GantryPoll.swap(url, id) fetches a server-rendered partial and replaces the element
 * #id with the one of the same id in it; it resolves to the new element.
 *
 * Declarative: an element with data-live-url polls that partial and swaps its first
 * child that has an id; data-live-every / data-live-hidden set the intervals; polling
 * stops once the fresh element says data-final="1".
 */
(function () {
  "use strict";

  function every(tick, options) {
    var visible = (options && options.visible) || 3000;
    var hidden = (options && options.hidden) || 20000;
    var timer = null, stopped = false, failures = 0;

    function schedule() {
      if (stopped) return;
      clearTimeout(timer);
      var wait = document.hidden ? hidden : visible;
      if (failures) wait = Math.min(60000, wait * Math.pow(2, failures));
      timer = setTimeout(run, wait);
    }
    function run() {
      if (stopped) return;
      var result;
      try { result = tick(); } catch (error) { result = Promise.reject(error); }
      Promise.resolve(result).then(function (keepGoing) {
        failures = 0;
        if (keepGoing === false) { stopped = true; return; }
        schedule();
      }, function () { failures = Math.min(failures + 1, 5); schedule(); });
    }
    document.addEventListener("visibilitychange", function () {
      if (!document.hidden && !stopped) { clearTimeout(timer); run(); }
    });
    schedule();
    return {stop: function () { stopped = true; clearTimeout(timer); }, now: run};
  }

  function swap(url, id) {
    return fetch(url, {credentials: "same-origin"}).then(function (response) {
      if (!response.ok) throw new Error("HTTP " + response.status);
      return response.text();
    }).then(function (html) {
      var holder = document.createElement("div");
      holder.innerHTML = html;
      var fresh = holder.querySelector("#" + id), old = document.getElementById(id);
      // Never swap away a form someone is typing into (a drain reason, say).
      var typing = old && old.contains(document.activeElement) && /^(INPUT|TEXTAREA|SELECT)$/.test(document.activeElement.tagName);
      if (fresh && old && !typing) old.replaceWith(fresh);
      return typing ? old : (fresh || old);
    });
  }

  function declarative(root) {
    var target = root.querySelector("[id]");
    if (!target || target.dataset.final === "1") return;
    var id = target.id;
    every(function () {
      return swap(root.dataset.liveUrl, id).then(function (fresh) {
        return !(fresh && fresh.dataset.final === "1");
      });
    }, {visible: Number(root.dataset.liveEvery) || 5000, hidden: Number(root.dataset.liveHidden) || 30000});
  }

  window.GantryPoll = {every: every, swap: swap};
  document.addEventListener("DOMContentLoaded", function () {
    Array.prototype.forEach.call(document.querySelectorAll("[data-live-url]"), declarative);
  });
})();
