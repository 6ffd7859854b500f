// The live view of ratelimit. It reads only the JSON API beside it
// (../api/v1/...), which scripts can use the same way. Every value from
// a request (keys, values, domains) is put in the page as text, never as
// markup: nothing here parses a string as HTML.
"use strict";
(function () {
  const WINDOW = 300; // seconds of series, as the API serves them
  const api = (path) => new URL("../api/v1/" + path, document.baseURI).toString();
  const $ = (id) => document.getElementById(id);

  const state = {
    rulesKey: "",    // the rules document shown: its version and last load error
    end: 0,          // the Unix second the series end at
    series: new Map(), // rule ID -> {d, o, n}: arrays of WINDOW figures
    totals: null,    // {d, o, n}
    rows: new Map(), // rule ID -> the row's live cells
    trs: new Map(),  // rule ID -> its row, for the links between twins
    last: null,      // the last event
    lastAt: 0,       // when it came (ms)
    paused: false,
    filter: "",
    loading: false,
  };

  // el builds an element; strings among children become text nodes.
  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === "class") e.className = v;
      else e.setAttribute(k, v);
    }
    for (const c of children) {
      if (c !== null && c !== undefined) e.append(c);
    }
    return e;
  }

  const zeros = () => new Array(WINDOW).fill(0);
  const pad = (a) => (a.length >= WINDOW ? a.slice(-WINDOW) : zeros().slice(a.length).concat(a));

  function fmtNum(v) {
    if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (v >= 1e4) return Math.round(v / 1e3) + "k";
    return String(Math.round(v));
  }

  function fmtSeconds(s) {
    if (s < 1) return "<1 s";
    if (s < 120) return Math.round(s) + " s";
    if (s < 7200) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
    if (s < 172800) return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " min";
    return Math.round(s / 86400) + " d";
  }

  const UNITS = { SECOND: "s", MINUTE: "min", HOUR: "h", DAY: "day", WEEK: "week", MONTH: "month", YEAR: "year" };
  function fmtLimit(l) {
    const unit = UNITS[l.unit] || l.unit;
    return l.requests_per_unit + " / " + (l.unit_multiplier > 1 ? l.unit_multiplier + " " : "") + unit;
  }

  function fmtTime(iso) {
    const d = new Date(iso);
    return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  }

  function fmtMs(v) {
    if (v === 0) return "–";
    if (v < 1) return Math.round(v * 1000) + " µs";
    if (v < 100) return v.toFixed(1) + " ms";
    return Math.round(v) + " ms";
  }

  // draw draws a sparkline: decisions as an area, near and over as lines,
  // on one scale.
  function draw(canvas, s) {
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth || 150, h = canvas.clientHeight || 28;
    if (canvas.width !== Math.round(w * dpr)) canvas.width = Math.round(w * dpr);
    if (canvas.height !== Math.round(h * dpr)) canvas.height = Math.round(h * dpr);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    let top = 1;
    for (const v of s.d) if (v > top) top = v;
    const x = (i) => (i / (WINDOW - 1)) * w;
    const y = (v) => h - 1 - (v / top) * (h - 3);
    const css = getComputedStyle(document.documentElement);
    ctx.beginPath();
    ctx.moveTo(0, h);
    s.d.forEach((v, i) => ctx.lineTo(x(i), y(v)));
    ctx.lineTo(w, h);
    ctx.closePath();
    ctx.fillStyle = css.getPropertyValue("--d-fill").trim();
    ctx.fill();
    const line = (a, color) => {
      ctx.beginPath();
      a.forEach((v, i) => (i ? ctx.lineTo(x(i), y(v)) : ctx.moveTo(x(i), y(v))));
      ctx.strokeStyle = css.getPropertyValue(color).trim();
      ctx.lineWidth = 1.25;
      ctx.stroke();
    };
    line(s.d, "--d");
    line(s.n, "--near");
    line(s.o, "--over");
    const peak = Math.max(...s.d);
    canvas.setAttribute("aria-label", "last 5 minutes: peak " + peak + " decisions/s, " +
      s.o.reduce((a, b) => a + b, 0) + " over the limit");
  }

  // ---- rules ----

  function renderRules(doc) {
    const src = doc.source;
    $("source").textContent = src
      ? "From " + src.kind + " " + src.location + (src.version ? " · version " + src.version : "") + " · loaded " + fmtTime(src.loaded_at)
      : "No rules loaded.";
    const banner = $("load-error");
    if (doc.last_error) {
      banner.textContent = "The last reload failed at " + fmtTime(doc.last_error.at) + "; the rules below still serve.\n" + doc.last_error.error;
      banner.hidden = false;
    } else {
      banner.hidden = true;
    }
    const body = $("rules-body");
    body.replaceChildren();
    state.rows.clear();
    state.trs.clear();
    if (doc.domains.length === 0) body.append(el("p", { class: "empty" }, "No rules."));
    for (const d of doc.domains) {
      const tbody = el("tbody");
      for (const r of d.rules) tbody.append(ruleRow(r));
      body.append(el("section", { class: "domain", "aria-label": "domain " + d.domain },
        el("h3", {}, "Domain ", el("code", {}, d.domain), el("small", {}, " · " + d.rules.length + " rules")),
        el("div", { class: "table-wrap" }, el("table", {},
          el("thead", {}, el("tr", {},
            el("th", { scope: "col" }, "Descriptor chain"), el("th", { scope: "col" }, "Limit"),
            el("th", { scope: "col" }, "Algorithm"), el("th", { scope: "col" }, "Flags"),
            el("th", { scope: "col" }, "Source"), el("th", { scope: "col", class: "num" }, "Decisions/s"),
            el("th", { scope: "col", class: "num" }, "Over/s"), el("th", { scope: "col", class: "num" }, "Near/s"),
            el("th", { scope: "col" }, "Last 5 minutes"))),
          tbody))));
    }
  }

  function ruleRow(r) {
    const chain = el("td", { class: "chain mono" });
    chain.style.paddingLeft = 10 + 16 * (r.chain.length - 1) + "px";
    r.chain.forEach((c, i) => {
      if (i < r.chain.length - 1) chain.append(el("span", { class: "up" }, c + " › "));
      else chain.append(el("strong", {}, c));
    });
    const flags = el("td");
    const chip = (cls, text) => flags.append(el("span", { class: "chip " + cls }, text));
    if (r.unlimited) chip("", "unlimited");
    if (r.shadow_mode) chip("shadow", "shadow");
    if (r.shadow) {
      flags.append(el("span", { class: "chip shadow", title: "a shadow limit: counted, never refuses; Over/s is what it would refuse" }, "shadow limit"));
    }
    // A rule and its shadow twins (the limits of the same list in the
    // other role) link to each other.
    for (const id of r.twins || []) {
      const a = el("a", { class: "chip twin", href: "#rules", title: (r.shadow ? "the enforced limit beside it: " : "its shadow twin: ") + id },
        (r.shadow ? "shadow of " : "twin ") + id.slice(id.lastIndexOf(".") + 1));
      a.addEventListener("click", (e) => {
        e.preventDefault();
        const tr = state.trs.get(id);
        if (!tr) return;
        tr.hidden = false;
        tr.scrollIntoView({ block: "center" });
        tr.classList.add("flash");
        setTimeout(() => tr.classList.remove("flash"), 1500);
      });
      flags.append(a);
    }
    if (r.quota_mode) chip("quota", "quota");
    if (r.detailed_metric) chip("", "detailed");
    if (r.name) chip("", "name: " + r.name);
    if (r.replaces) chip("", "replaces: " + r.replaces.join(", "));
    const algo = r.algorithm.replace("_", " ") + (r.burst ? " · burst " + r.burst : "");
    const cells = {
      d: el("td", { class: "num" }, "–"), o: el("td", { class: "num over" }, "–"), n: el("td", { class: "num near" }, "–"),
      spark: el("canvas", { class: "spark", width: "150", height: "28", role: "img", "aria-label": "no traffic yet" }),
    };
    const tr = el("tr", { "data-id": r.id },
      chain, el("td", {}, r.unlimited ? "unlimited" : fmtLimit(r)), el("td", {}, algo), flags,
      el("td", { class: "src" }, r.source), cells.d, cells.o, cells.n,
      el("td", {}, r.tracked ? cells.spark : el("span", { class: "dim", title: "only the first rules have series" }, "not tracked")));
    cells.tr = tr;
    cells.shadow = r.shadow;
    if (r.shadow) cells.o.title = "requests a second it would have refused";
    state.trs.set(r.id, tr);
    cells.text = (r.id + " " + r.chain.join(" ") + " " + r.source + " " + (r.name || "") + (r.shadow ? " shadow" : "")).toLowerCase();
    if (r.tracked) state.rows.set(r.id, cells);
    else tr.dataset.text = cells.text;
    return tr;
  }

  function renderFigures() {
    for (const [id, c] of state.rows) {
      const s = state.series.get(id);
      if (!s) continue;
      c.d.textContent = fmtNum(s.d[WINDOW - 1]);
      c.o.textContent = fmtNum(s.o[WINDOW - 1]) + (c.shadow ? " would" : "");
      c.n.textContent = fmtNum(s.n[WINDOW - 1]);
      if (!c.tr.hidden) draw(c.spark, s);
    }
    const t = state.totals;
    if (t) {
      $("t-decisions").textContent = fmtNum(t.d[WINDOW - 1]);
      $("t-over").textContent = fmtNum(t.o[WINDOW - 1]);
      $("t-near").textContent = fmtNum(t.n[WINDOW - 1]);
      draw($("t-spark"), t);
    }
  }

  // ---- top keys ----

  const STATES = {
    over: "its last request was over the limit",
    full: "no room left: its next request will be over the limit",
    near: "near its limit (NEAR_LIMIT_RATIO)",
  };

  function renderKeys(doc) {
    const body = $("keys-body");
    body.replaceChildren();
    let shown = 0;
    for (const d of doc.domains) {
      if (d.keys.length === 0) continue;
      const tbody = el("tbody");
      for (const k of d.keys) {
        const key = el("td", { class: "key" });
        k.entries.forEach((e, i) => {
          if (i) key.append(", ");
          key.append(el("span", { class: "k" }, e.key + "="), el("span", { class: "v" }, e.value));
        });
        if (k.truncated) key.append(el("span", { class: "dim", title: "cut to 256 bytes" }, "…"));
        // over: its last decision was refused; full: the next one will be.
        // A shadow limit's key was never refused: it would have been.
        const st = k.over ? "over" : k.used >= k.capacity ? "full" : "near";
        const label = k.shadow && st === "over" ? "WOULD REFUSE" : st === "near" ? "near" : st.toUpperCase();
        const fill = el("span", { class: "fill" });
        fill.style.width = Math.min(100, (100 * k.used) / Math.max(k.capacity, 1)) + "%";
        const used = el("td", { class: "num" }, fmtNum(k.used) + " / " + fmtNum(k.capacity),
          el("span", { class: "bar", role: "img", "aria-label": "used " + k.used + " of " + k.capacity }, fill));
        const tr = el("tr", { class: "is-" + st },
          key, el("td", { class: "rule" }, k.override ? "override " + fmtLimit(k.limit) : k.rule + (k.shadow ? " (shadow)" : "")),
          used, el("td", { class: "state", title: (k.shadow ? "shadow limit, never refuses: " : "") + STATES[st] }, label),
          el("td", { class: "num" }, fmtSeconds(k.reset_in_seconds)),
          el("td", { class: "num", title: "decisions near or over the limit, recent (± " + k.count_error + ")" }, fmtNum(k.count)));
        tr.dataset.text = (k.entries.map((e) => e.key + "=" + e.value).join(", ") + " " + k.rule).toLowerCase();
        tbody.append(tr);
        shown++;
      }
      body.append(el("section", { class: "domain", "aria-label": "top keys of domain " + d.domain },
        el("h3", {}, "Domain ", el("code", {}, d.domain)),
        el("div", { class: "table-wrap" }, el("table", {},
          el("thead", {}, el("tr", {},
            el("th", { scope: "col" }, "Key"), el("th", { scope: "col" }, "Rule"), el("th", { scope: "col", class: "num" }, "Used / limit"),
            el("th", { scope: "col" }, "State"), el("th", { scope: "col", class: "num" }, "Resets in"),
            el("th", { scope: "col", class: "num" }, "Recent"))),
          tbody))));
    }
    if (shown === 0) body.append(el("p", { class: "empty" }, "No key is near its limit right now."));
    applyFilter();
  }

  // ---- requests that matched nothing ----

  // unmatchedTable is a table of rows under a heading; rows are lists of
  // cells, the last one the recent count.
  function unmatchedTable(title, head, rows) {
    const tbody = el("tbody");
    for (const r of rows) {
      const tr = el("tr", {}, ...r.cells);
      tr.dataset.text = r.text.toLowerCase();
      tbody.append(tr);
    }
    return el("section", { class: "domain", "aria-label": title },
      el("h3", {}, title),
      el("div", { class: "table-wrap" }, el("table", {},
        el("thead", {}, el("tr", {}, ...head.map((h, i) =>
          el("th", { scope: "col", class: i === head.length - 1 ? "num" : "" }, h)))),
        tbody)));
  }

  function renderUnmatched(doc) {
    const body = $("unmatched-body");
    body.replaceChildren();
    const recent = (u) => el("td", { class: "num", title: "recent (± " + u.count_error + ")" }, fmtNum(u.count));
    if (doc.domains.length > 0) {
      body.append(unmatchedTable("Unknown domains", ["Domain", "Requests, recent"], doc.domains.map((u) => ({
        cells: [el("td", { class: "key" }, u.domain), recent(u)], text: u.domain,
      }))));
    }
    if (doc.keys.length > 0) {
      body.append(unmatchedTable("Keys no rule matched", ["Domain", "Keys", "Last descriptor", "Descriptors, recent"], doc.keys.map((u) => {
        const ex = el("td", { class: "key" });
        u.example.forEach((e, i) => {
          if (i) ex.append(", ");
          ex.append(el("span", { class: "k" }, e.key + "="), el("span", { class: "v" }, e.value));
        });
        if (u.truncated) ex.append(el("span", { class: "dim", title: "cut to 256 bytes" }, "…"));
        return {
          cells: [el("td", { class: "key" }, u.domain), el("td", { class: "key" }, u.keys.join(", ")), ex, recent(u)],
          text: u.domain + " " + u.keys.join(" ") + " " + u.example.map((e) => e.key + "=" + e.value).join(", "),
        };
      })));
    }
    if (body.childElementCount === 0) body.append(el("p", { class: "empty" }, "Every request of the last minute matched a rule."));
    applyFilter();
  }

  // ---- store ----

  function renderStore(s, t) {
    const dl = $("store");
    dl.replaceChildren();
    const row = (name, ...value) => dl.append(el("dt", {}, name), el("dd", {}, ...value));
    row("Backend", s.backend || "–");
    row("Health", s.healthy ? "answers" : el("span", { class: "bad" }, "does not answer"));
    const l = s.latency;
    row("Round trip", l.samples
      ? "p50 " + fmtMs(l.p50_ms) + " · p90 " + fmtMs(l.p90_ms) + " · p99 " + fmtMs(l.p99_ms) + " · max " + fmtMs(l.max_ms)
      : "no sample yet",
    el("span", { class: "dim" }, l.samples ? " (" + l.samples + " timed in " + Math.round(l.window_seconds) + " s)" : ""));
    row("Errors", s.errors_last_minute ? el("span", { class: "bad" }, s.errors_last_minute + " in the last minute") : "none in the last minute");
    if (s.breakers) {
      const b = s.breakers;
      row("Breakers", b.open ? el("span", { class: "bad" }, b.open + " open") : "all closed",
        el("span", { class: "dim" }, " · " + b.trips + " trips, " + b.rejections + " refused"));
    } else {
      row("Breakers", el("span", { class: "dim" }, "none for this store"));
    }
    const hits = t ? t.nc[WINDOW - 1] : 0;
    row("Near cache", s.near_cache ? s.near_cache.entries + " keys · " + fmtNum(hits) + " hits/s" : el("span", { class: "dim" }, "off (LOCAL_CACHE_SIZE_IN_BYTES)"));
  }

  // ---- quota (RLQS) ----

  const pct = (x) => Math.round(100 * x) + " %";
  const rate = (x) => (x < 0 ? "–" : x >= 10 ? String(Math.round(x)) : x.toFixed(2));

  function renderQuota(doc) {
    const section = $("quota");
    section.hidden = !doc.enabled || doc.rules.length === 0;
    if (section.hidden) return;
    $("quota-summary").textContent = doc.streams + " streams · " + doc.subscriptions + " subscriptions";
    const body = $("quota-body");
    body.replaceChildren();
    const tbody = el("tbody");
    for (const r of doc.rules) {
      const limit = r.rate > 0 ? rate(r.rate) + "/s · burst " + r.burst : "–";
      const share = r.buckets ? el("span", { class: r.max_share > 1 ? "bad" : "" }, pct(r.max_share)) : "–";
      const tr = el("tr", {},
        el("td", { class: "mono" }, r.domain + " · " + r.rule), el("td", {}, r.policy), el("td", {}, limit),
        el("td", { class: "num" }, String(r.buckets)), el("td", { class: "num" }, String(r.subscribers)),
        el("td", { class: "num" }, share), el("td", { class: "num" }, fmtNum(r.allowed)),
        el("td", { class: "num" }, fmtNum(r.denied)),
        el("td", { class: "num" }, r.beyond_share ? el("span", { class: "bad" }, fmtNum(r.beyond_share)) : "0"),
        el("td", { class: "src" }, r.source));
      tr.dataset.text = (r.domain + " " + r.rule + " " + r.match).toLowerCase();
      tbody.append(tr);
      for (const b of r.top || []) {
        const id = Object.entries(b.id).map(([k, v]) => k + "=" + v).join(", ");
        const envoys = b.subscribers.map((s) =>
          (s.peer || "stream " + s.stream) + (s.gone ? " (gone)" : "") + ": " + rate(s.rate) + "/s of " + rate(s.demand) + "/s wanted, " + s.burst + " tokens").join(" · ");
        const row = el("tr", { class: "sub" }, el("td", { class: "mono key", colspan: "5" }, "{" + id + "}"),
          el("td", { class: "num" }, pct(b.share)), el("td", { class: "key", colspan: "4" }, envoys));
        row.dataset.text = tr.dataset.text + " " + id.toLowerCase();
        tbody.append(row);
      }
    }
    body.append(el("div", { class: "table-wrap" }, el("table", {},
      el("thead", {}, el("tr", {},
        el("th", { scope: "col" }, "Rule"), el("th", { scope: "col" }, "Policy"), el("th", { scope: "col" }, "Limit per bucket"),
        el("th", { scope: "col", class: "num" }, "Buckets"), el("th", { scope: "col", class: "num" }, "Envoys"),
        el("th", { scope: "col", class: "num", title: "the largest sum of the shares in one bucket, over its limit" }, "Shares / limit"),
        el("th", { scope: "col", class: "num" }, "Allowed"), el("th", { scope: "col", class: "num" }, "Denied"),
        el("th", { scope: "col", class: "num", title: "admitted beyond the shares granted: before a first assignment, after one expired" }, "Beyond shares"),
        el("th", { scope: "col" }, "Source"))),
      tbody)));
    applyFilter();
  }

  // pollQuota refreshes the quota section every 2 s. A failed fetch shows
  // in the status line; a failed rendering is a bug, left to the console.
  async function pollQuota() {
    setTimeout(pollQuota, 2000);
    if (state.paused) return;
    let doc;
    try {
      doc = await getJSON("quota");
    } catch (err) {
      showError(err);
      return;
    }
    renderQuota(doc);
  }

  // ---- filter, pause, keys ----

  function applyFilter() {
    const f = state.filter;
    for (const tr of document.querySelectorAll("#rules-body tr[data-id], #keys-body tbody tr, #unmatched-body tbody tr, #quota-body tbody tr")) {
      const text = tr.dataset.text || (state.rows.get(tr.dataset.id) || {}).text || "";
      tr.hidden = f !== "" && !text.includes(f);
    }
  }

  function setPaused(p) {
    state.paused = p;
    $("pause").setAttribute("aria-pressed", String(p));
    $("pause").textContent = p ? "Resume" : "Pause";
    if (!p && state.last) render(state.last);
    status();
  }

  function status() {
    const s = $("status");
    const age = (Date.now() - state.lastAt) / 1000;
    s.classList.toggle("stale", state.lastAt > 0 && age > 3.5);
    if (state.paused) s.textContent = "paused · figures frozen";
    else if (state.lastAt === 0) s.textContent = "connecting…";
    else if (age > 3.5) s.textContent = "stale · no update for " + Math.round(age) + " s";
    else s.textContent = "live · " + new Date(state.lastAt).toLocaleTimeString();
  }

  document.addEventListener("keydown", (e) => {
    const typing = e.target instanceof HTMLInputElement;
    if (e.key === "Escape" && typing) {
      e.target.value = "";
      state.filter = "";
      applyFilter();
      e.target.blur();
      return;
    }
    if (typing || e.ctrlKey || e.metaKey || e.altKey) return;
    if (e.key === "/") { e.preventDefault(); $("filter").focus(); }
    else if (e.key === "p") setPaused(!state.paused);
    else if (e.key === "k") $("keys").focus();
    else if (e.key === "u") $("unmatched").focus();
    else if (e.key === "r") $("rules").focus();
    else if (e.key === "q") $("quota").focus();
  });
  $("filter").addEventListener("input", (e) => { state.filter = e.target.value.trim().toLowerCase(); applyFilter(); });
  $("pause").addEventListener("click", () => setPaused(!state.paused));

  // ---- data ----

  async function getJSON(path) {
    const r = await fetch(api(path), { cache: "no-store" });
    if (!r.ok) throw new Error(path + ": HTTP " + r.status);
    return r.json();
  }

  async function reload() {
    if (state.loading) return;
    state.loading = true;
    try {
      const [rules, traffic, keys, unmatched] = await Promise.all([getJSON("rules"), getJSON("traffic"), getJSON("topkeys"), getJSON("unmatched")]);
      state.rulesKey = rules.version + "|" + (rules.last_error ? rules.last_error.at : "");
      state.end = traffic.end;
      state.series.clear();
      for (const [id, s] of Object.entries(traffic.rules)) {
        state.series.set(id, { d: pad(s.decisions), o: pad(s.over_limit), n: pad(s.near_limit) });
      }
      const t = traffic.totals;
      state.totals = { d: pad(t.decisions), o: pad(t.over_limit), n: pad(t.near_limit), nc: pad(t.near_cache_hits), e: pad(t.store_errors) };
      renderRules(rules);
      renderFigures();
      renderKeys(keys);
      renderUnmatched(unmatched);
      renderStore(traffic.store, state.totals);
      applyFilter();
    } finally {
      state.loading = false;
    }
  }

  // push appends the figures of second end, with zeros for any second
  // missed in between.
  function push(arrays, values, gap) {
    arrays.forEach((a, i) => {
      for (let g = 1; g < gap; g++) a.push(0);
      a.push(values[i] || 0);
      a.splice(0, a.length - WINDOW);
    });
  }

  function onTick(ev) {
    state.last = ev;
    state.lastAt = Date.now();
    if (ev.rules_version + "|" + ev.load_error_at !== state.rulesKey) {
      reload().catch(showError);
      return;
    }
    if (ev.end > state.end) {
      const gap = state.end ? Math.min(ev.end - state.end, WINDOW) : 1;
      for (const [id, s] of state.series) push([s.d, s.o, s.n], ev.rules[id] || [], gap);
      const t = state.totals;
      push([t.d, t.o, t.n, t.nc, t.e], ev.totals, gap);
      state.end = ev.end;
    }
    if (!state.paused) render(ev);
    status();
  }

  function render(ev) {
    renderFigures();
    renderKeys(ev.topkeys);
    renderUnmatched(ev.unmatched);
    renderStore(ev.store, state.totals);
  }

  function showError(err) {
    const s = $("status");
    s.textContent = "error: " + err.message;
    s.classList.add("stale");
  }

  function connect() {
    const es = new EventSource(api("stream"));
    es.addEventListener("tick", (m) => onTick(JSON.parse(m.data)));
    es.addEventListener("error", () => { if (es.readyState !== EventSource.OPEN) status(); });
  }

  setInterval(status, 1000);
  pollQuota();
  reload().then(connect, (err) => { showError(err); setTimeout(() => reload().then(connect, showError), 2000); });
})();
