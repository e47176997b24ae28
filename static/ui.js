/* The dashboard's live behaviour, on top of htmx and its ws extension (no build step).
 *
 * - The socket's cursor goes in-band: on every (re)open we send {"after": lastSeq}, the
 *   newest position this page shows, so a reconnect catches up from there (DESIGN §13).
 * - Every live fragment carries data-seq; one older than the element it would replace is
 *   dropped, so a late or replayed fragment never rolls the page back.
 * - The extension reconnects by itself only after abnormal closes (1006, 1011-1013); after
 *   any other close (a clean 1000 on Daphne's timeout, say) we reconnect ourselves.
 * - A page of children fetched by GET may be older than what the socket has shown since;
 *   it is fetched again until it is not.
 * - An action id names one use of a form: after each request the form gets a fresh one
 *   (a second use is a new action, not a repeat of the first), and a form is kept across
 *   live updates (hx-preserve) only while it is open; a closed one takes the fresh render
 *   (its new id, the count it confirms).
 * - A conversation's earlier entries load by pages above its latest ones (a GET each) and
 *   are kept across live updates, which re-render the latest page only.
 */
(function () {
  "use strict";
  var lastSeq = 0;
  var opened = false;
  var retries = 0;
  // Not worth reconnecting: 4401 the login ended (logout, expiry), 4403 no role, ...
  var REFUSED = [4400, 4401, 4403, 4404];

  function seqOf(el) { return el && el.dataset && el.dataset.seq ? Number(el.dataset.seq) : -1; }
  function setState(text, name) {
    var el = document.getElementById("conn-state");
    if (el) { el.textContent = text; el.className = "conn conn-" + name; }
    document.documentElement.dataset.connection = name;
  }
  function bump(seq) {
    if (seq > lastSeq) { lastSeq = seq; document.documentElement.dataset.seq = String(seq); }
  }

  htmx.config.wsReconnectDelay = function (count) { return Math.min(250 * Math.pow(2, count), 3000); };
  // Action results are shown in place whatever their status (a 403 or 409 explains itself).
  htmx.config.responseHandling = [{ code: "204", swap: false }, { code: "...", swap: true }];

  document.addEventListener("DOMContentLoaded", function () {
    bump(seqOf(document.getElementById("live")));
    checkPages();
  });

  document.addEventListener("htmx:oobBeforeSwap", function (e) {
    var incoming = e.detail.fragment && e.detail.fragment.firstElementChild;
    var seq = seqOf(incoming);
    if (seq >= 0 && seq < seqOf(e.detail.target)) { e.detail.shouldSwap = false; return; }
    if (!e.detail.fragment || !e.detail.fragment.querySelectorAll) { return; }
    e.detail.fragment.querySelectorAll("[hx-preserve]").forEach(function (kept) {
      var shown = document.getElementById(kept.id);
      if (shown && shown.classList.contains("earlier")) {
        if (shown.querySelector("ol")) { carryOver(shown, kept); } else { kept.removeAttribute("hx-preserve"); }
      } else if (!shown || !shown.open) { kept.removeAttribute("hx-preserve"); }
    });
  });

  // A conversation's earlier entries, once loaded, stay across live updates (entries do
  // not change once written): the entries the fresh latest page no longer holds (newer
  // ones pushed them out of it) join them, and those between the two (more came at once
  // than a page holds) are fetched into place, so that none goes missing.
  // With nothing loaded, the fresh render's button (before its own oldest entry) is used.
  function carryOver(earlier, fresh) {
    var list = earlier.nextElementSibling;
    var freshList = fresh.nextElementSibling;
    if (!list || !freshList || list.tagName !== "OL" || freshList.tagName !== "OL") { return; }
    var kept = {};
    freshList.querySelectorAll(":scope > li.entry").forEach(function (li) { kept[li.id] = true; });
    var moved = document.createElement("ol");
    moved.className = "entries earlier-page";
    list.querySelectorAll(":scope > li.entry").forEach(function (li) {
      if (!kept[li.id]) { moved.appendChild(li); }
    });
    if (moved.children.length) { earlier.appendChild(moved); }
    var newest = list.dataset.newest;
    var oldest = freshList.dataset.oldest;
    if (!newest || !oldest || oldest === list.dataset.oldest) { return; }
    var between = document.createElement("p");
    between.className = "more";
    earlier.appendChild(between);
    htmx.ajax("GET", earlier.dataset.src + "?before=" + encodeURIComponent(oldest) +
              "&after=" + encodeURIComponent(newest), { target: between, swap: "outerHTML" });
  }

  function freshId() {
    var bytes = new Uint8Array(8);
    window.crypto.getRandomValues(bytes);  // unlike randomUUID, also on plain http
    return Array.prototype.map.call(bytes, function (b) {
      return ("0" + b.toString(16)).slice(-2);
    }).join("");
  }
  document.addEventListener("htmx:afterRequest", function (e) {
    var form = e.detail.elt && e.detail.elt.closest ? e.detail.elt.closest("form") : null;
    var id = form && form.querySelector("input[name=action_id]");
    if (!id) { return; }
    var dash = id.value.indexOf("-");
    id.value = freshId() + (dash >= 0 ? id.value.slice(dash) : "");
    var done = e.detail.xhr && e.detail.xhr.status >= 200 && e.detail.xhr.status < 300;
    var details = form.closest("details");
    if (done && details) { details.open = false; }
  });

  document.addEventListener("htmx:wsOpen", function (e) {
    opened = true;
    retries = 0;
    setState("live", "live");
    e.detail.socketWrapper.sendImmediately(JSON.stringify({ after: lastSeq }));
  });
  document.addEventListener("htmx:wsConnecting", function () {
    setState(opened ? "reconnecting" : "connecting", opened ? "reconnecting" : "connecting");
  });
  document.addEventListener("htmx:wsAfterMessage", function () {
    bump(seqOf(document.getElementById("feed-state")));
    checkPages();
  });
  document.addEventListener("htmx:wsClose", function (e) {
    var code = e.detail.event.code;
    if (REFUSED.indexOf(code) >= 0) { setState("refused (" + code + "): reload to log in", "refused"); return; }
    opened = true;
    setState("reconnecting", "reconnecting");
    if ([1006, 1011, 1012, 1013].indexOf(code) >= 0) { return; } // the extension retries
    retries += 1;
    setTimeout(function () {
      var old = document.getElementById("live");
      if (!old) { return; }
      var fresh = old.cloneNode(false);
      old.replaceWith(fresh);
      htmx.process(fresh);
    }, Math.min(250 * Math.pow(2, retries), 3000));
  });

  function checkPages() {
    document.querySelectorAll("li.page[data-seq]:not([data-checked])").forEach(function (page) {
      if (seqOf(page) >= lastSeq) { page.dataset.checked = "1"; return; }
      page.dataset.checked = "refetching";
      htmx.ajax("GET", page.dataset.src, { target: page, swap: "outerHTML", select: "li.page" });
    });
  }
  document.addEventListener("htmx:afterSettle", checkPages);
})();
