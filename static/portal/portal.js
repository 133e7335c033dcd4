// Progressive enhancement only: every page works without this file (and without htmx).
(function () {
  "use strict";
  document.documentElement.classList.add("js");

  // Preemption notices: count down to the deadline the server rendered.
  function remaining(seconds) {
    if (seconds <= 0) return "0 s";
    var d = Math.floor(seconds / 86400), h = Math.floor(seconds % 86400 / 3600),
        m = Math.floor(seconds % 3600 / 60), s = Math.floor(seconds % 60), parts = [];
    if (d) parts.push(d + " d");
    if (h) parts.push(h + " h");
    if (m) parts.push(m + " min");
    if (s) parts.push(s + " s");
    return parts.slice(0, 2).join(" ");
  }
  function tick() {
    document.querySelectorAll("[data-countdown-to]").forEach(function (el) {
      var left = (Date.parse(el.getAttribute("data-countdown-to")) - Date.now()) / 1000;
      el.textContent = remaining(Math.max(0, Math.round(left)));
    });
  }
  setInterval(tick, 1000);

  // A workload's log shows its latest lines: scrolled to the end each time it arrives (unless the reader
  // scrolled up in the one it replaces).
  document.addEventListener("htmx:beforeSwap", function (event) {
    var log = event.detail.target && event.detail.target.querySelector && event.detail.target.querySelector("pre.log");
    window.__logPinned = !log || log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
  });
  document.addEventListener("htmx:afterSettle", function () {
    var log = document.querySelector("#workload-log pre.log");
    if (log && window.__logPinned !== false) log.scrollTop = log.scrollHeight;
  });

  // "Copy" next to a secret shown once.
  document.addEventListener("DOMContentLoaded", function () {
    tick();
    document.querySelectorAll("[data-copy]").forEach(function (button) {
      button.hidden = false;
      button.addEventListener("click", function () {
        var field = document.querySelector(button.getAttribute("data-copy"));
        field.select();
        var done = function () { button.textContent = "Copied"; };
        if (navigator.clipboard) navigator.clipboard.writeText(field.value).then(done, function () {});
        else { document.execCommand("copy"); done(); }
      });
    });
    // The request form: with a model chosen, only its MIG profiles are offered (auto: every model's).
    var model = document.getElementById("f-model");
    var profile = document.getElementById("f-profile");
    if (model && profile) {
      var sync = function () {
        profile.querySelectorAll("optgroup").forEach(function (group) {
          var shown = model.value === "auto" || group.label === model.value;
          group.hidden = !shown;
          group.disabled = !shown;
        });
        var chosen = profile.options[profile.selectedIndex];
        if (!chosen || chosen.parentElement.disabled) {
          var first = profile.querySelector("optgroup:not([disabled]) option");
          if (first) { first.selected = true; profile.dispatchEvent(new Event("change", {bubbles: true})); }
        }
      };
      model.addEventListener("change", sync);
      sync();
    }
  });
})();
