/* Relative times ("3 s ago") kept current: every <time data-ago datetime="..."> the
 * server rendered is re-worded every few seconds; its title keeps the absolute time. */
(function () {
  "use strict";
  var UNITS = [[86400, "d"], [3600, "h"], [60, "min"], [1, "s"]];
  function words(then) {
    var seconds = (Date.now() - then) / 1000;
    var later = seconds < 0;
    seconds = Math.abs(seconds);
    if (seconds < 1) { return "just now"; }
    for (var i = 0; i < UNITS.length; i++) {
      if (seconds >= UNITS[i][0]) {
        var amount = Math.floor(seconds / UNITS[i][0]) + " " + UNITS[i][1];
        return later ? "in " + amount : amount + " ago";
      }
    }
    return "just now";
  }
  function refresh() {
    document.querySelectorAll("time[data-ago]").forEach(function (el) {
      var then = Date.parse(el.getAttribute("datetime"));
      if (!isNaN(then)) { el.textContent = words(then); }
    });
  }
  document.addEventListener("DOMContentLoaded", refresh);
  document.addEventListener("htmx:afterSettle", refresh);
  setInterval(refresh, 5000);
})();
