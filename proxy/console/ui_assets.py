"""The inspector's one stylesheet and one script, served from the proxy itself (proxy layer, http).

No build step, no external asset: the CSP (``script-src 'self'``, ``style-src 'self'``) lets the
pages use nothing else. The script only ever sets ``textContent`` and element attributes, never
HTML, so nothing a log or a store holds can become markup.
"""

from __future__ import annotations

from typing import Final

CSS: Final = """
:root { --fg: #1d2330; --muted: #5c6577; --line: #d9dde5; --bg: #f6f7f9; --held: #fff1f0; --ok: #177a3c;
        --bad: #b42318; --diff: #fff4c2; --accent: #2754c5; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg); }
header { display: flex; justify-content: space-between; align-items: center; padding: 10px 24px;
         background: var(--fg); }
header .brand { color: #fff; font-weight: 600; text-decoration: none; }
header button { background: transparent; color: #fff; border: 1px solid #ffffff66; }
main { padding: 16px 24px 48px; max-width: 1400px; }
h1 { font-size: 20px; margin: 8px 0; } h2 { font-size: 16px; margin: 24px 0 8px; } h3 { font-size: 13px; margin: 4px 0; }
code, pre { font: 12px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
a { color: var(--accent); }
table { border-collapse: collapse; background: #fff; border: 1px solid var(--line); width: 100%; }
th, td { text-align: left; vertical-align: top; padding: 6px 10px; border-bottom: 1px solid var(--line); }
th { background: #eef0f4; font-weight: 600; font-size: 12px; color: var(--muted); }
td.num { text-align: right; font-variant-numeric: tabular-nums; width: 1%; white-space: nowrap; }
td.time { white-space: nowrap; color: var(--muted); width: 1%; }
td.type { white-space: nowrap; font-weight: 600; width: 1%; }
tr.held td { background: var(--held); }
tr.recovered td { background: #effaf2; }
tr.ev.quarantine td.type, tr.ev.rejected td.type, .bad, .error, .failure { color: var(--bad); }
tr.ev.recovered td.type, .ok { color: var(--ok); }
tr.ev.checkpoint td { color: var(--muted); }
td.thumb { width: 96px; }
img.thumb { display: block; width: 80px; height: 80px; object-fit: contain; background: #eee; border: 1px solid var(--line); }
.nothumb { display: block; width: 80px; height: 80px; font-size: 11px; color: var(--muted); padding: 22px 4px;
           text-align: center; border: 1px dashed var(--line); }
ul.refs { margin: 4px 0 0; padding-left: 18px; color: var(--muted); }
.summary, .pager, .empty { color: var(--muted); }
.note { color: var(--muted); font-style: italic; }
.no-replay { color: var(--muted); font-size: smaller; }
.result { margin-top: 4px; font-size: 12px; }
button { font: inherit; padding: 4px 12px; border-radius: 4px; border: 1px solid var(--accent); background: var(--accent);
         color: #fff; cursor: pointer; }
button:disabled { opacity: .5; cursor: default; }
input { font: inherit; padding: 3px 6px; border: 1px solid var(--line); border-radius: 4px; }
form.login { background: #fff; padding: 16px; border: 1px solid var(--line); max-width: 520px; }
table.facts { width: auto; } table.facts th { width: 1%; white-space: nowrap; }
.sides { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; }
.side { min-width: 0; }
pre.json { background: #fff; border: 1px solid var(--line); padding: 8px 0; margin: 0; overflow: auto; max-height: 75vh; }
pre.json .line { display: block; padding: 0 10px; white-space: pre; }
pre.json .line.diff { background: var(--diff); }
pre.json .line.mismatch { background: #ffd9d4; }
ul.paths { columns: 3; font-size: 12px; }
""".lstrip()

JS: Final = r"""
"use strict";
(function () {
  const meta = document.querySelector('meta[name="csrf-token"]');
  const csrf = meta ? meta.getAttribute("content") : "";

  async function post(url, body) {
    const response = await fetch(url, {
      method: "POST", credentials: "same-origin", cache: "no-store",
      headers: { "X-CSRF-Token": csrf, "Content-Type": "application/json" },
      body: body === undefined ? "" : JSON.stringify(body),
    });
    let data = null;
    try { data = await response.json(); } catch (e) { data = null; }
    return { ok: response.ok, status: response.status, data: data };
  }

  function failure(result) {
    const error = result.data && result.data.error;
    return error ? (error.code || result.status) + ": " + error.message : "HTTP " + result.status;
  }

  function say(element, text, good) {
    element.textContent = text;
    element.className = "result " + (good ? "ok" : "bad");
  }

  document.querySelectorAll("button.recover").forEach(function (button) {
    button.addEventListener("click", async function () {
      const row = button.closest("tr");
      const out = row.querySelector(".result");
      button.disabled = true;
      say(out, "verifying…", true);
      let result;
      try { result = await post(button.dataset.url); } catch (e) { result = { ok: false, status: 0, data: null }; }
      if (result.ok && result.data && result.data.recovered) {
        const d = result.data.event.data;
        say(out, "recovered at seq " + result.data.event.seq + ": verified " + d.media_type + ", " + d.bytes +
            " bytes, " + d.width + "×" + d.height, true);
        row.classList.remove("held");
        row.classList.add("recovered");
        row.dataset.state = "recovered";
        button.remove();
        const count = document.getElementById("held-count");
        if (count) { count.textContent = String(Math.max(0, Number(count.textContent) - 1)); }
      } else if (result.ok) {
        say(out, "not quarantined any more: nothing to lift", true);
        button.remove();
      } else {
        say(out, "verification failed: " + failure(result), false);
        button.disabled = false;
      }
    });
  });

  const fork = document.getElementById("fork");
  if (fork) {
    fork.addEventListener("submit", async function (event) {
      event.preventDefault();
      const out = document.getElementById("fork-result");
      const child = document.getElementById("fork-id").value;
      const seq = document.getElementById("fork-seq").value;
      const body = { new_session_id: child };
      if (seq !== "") { body.at_seq = Number(seq); }
      let result;
      try { result = await post(fork.dataset.url, body); } catch (e) { result = { ok: false, status: 0, data: null }; }
      if (result.ok) {
        out.textContent = "";
        out.className = "result ok";
        out.append("forked at seq " + result.data.event.data.at_seq + ": ");
        const link = document.createElement("a");
        link.id = "fork-link";
        link.href = "/admin/ui/sessions/" + encodeURIComponent(result.data.session);
        link.textContent = result.data.session;
        out.append(link);
      } else {
        say(out, "fork refused: " + failure(result), false);
      }
    });
  }

  document.querySelectorAll("img.thumb").forEach(function (img) {
    function none() {
      const span = document.createElement("span");
      span.className = "nothumb";
      span.textContent = "no verified bytes";
      img.replaceWith(span);
    }
    if (img.complete && img.naturalWidth === 0) { none(); } else { img.addEventListener("error", none); }
  });

  const logout = document.getElementById("logout");
  if (logout) {
    logout.addEventListener("click", async function () {
      await post("/admin/ui/logout");
      window.location.assign("/admin/ui/login");
    });
  }
})();
""".lstrip()

#: The tab's icon (without one a browser asks for ``/favicon.ico``, which is not the proxy's own path).
ICON: Final = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" rx="3" '
               'fill="#1d2330"/><path d="M4 4h8v8H4z" fill="none" stroke="#fff" stroke-width="1.5"/></svg>')
