// The decisions explorer of report.html. It reads the JSON that report/page.py embeds
// (explorer_data) and builds every element from it with textContent: no text of a trajectory is
// ever parsed as HTML.
"use strict";
(() => {
  const data = JSON.parse(document.getElementById("race-data").textContent);
  const TURN = 0, ACCEPTED = 1, REASON = 2, DROPS = 3, TOKENS = 4; // a candidate's fields
  const FILTERS = {
    all: "all", removed: "any removal", none: "none", too_long: "too_long", rejected: "rejected",
  };
  const state = { eps: data.selected, filter: "all", query: "", open: null };
  const trajectories = new Map(data.trajectories.map((t) => [t.id, t]));
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children) if (child !== null && child !== undefined) node.append(child);
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function fmt(x) {
    if (x === null || x === undefined) return "not finite";
    if (x === 0) return "0";
    const a = Math.abs(x);
    const s = a >= 0.01 && a < 1000 ? x.toPrecision(3) : x.toExponential(2);
    return x > 0 ? "+" + s : s;
  }

  const count = (n) => n.toLocaleString("en");
  const epsilon = () => Number(state.eps);
  const candidates = (id) => ((data.decisions[state.eps] || {})[id] || []);

  function status(t) {
    if (t.too_long) return "too_long";
    return candidates(t.id).some((c) => c[ACCEPTED]) ? "removed" : "none";
  }

  // The first action whose drop blocked the removal: over ε, or not finite.
  function blocker(c) {
    const k = c[DROPS].findIndex((d) => d === null || d > epsilon());
    return k < 0 ? null : c[TURN] + k;
  }

  // -- the list ----------------------------------------------------------------------------------
  function rejectText(r) {
    return `${r.file}:${r.line} [${r.code}] ${r.field || ""} ${r.message || ""}`;
  }

  function listed(filter) {
    const q = state.query.trim().toLowerCase();
    const items = [];
    if (filter !== "rejected") {
      for (const t of data.trajectories) {
        if (filter !== "all" && status(t) !== filter) continue;
        if (q && !t.id.toLowerCase().includes(q) && !t.question.toLowerCase().includes(q)) continue;
        items.push({ kind: "trajectory", item: t });
      }
    }
    if (filter === "rejected" || filter === "all") {
      data.rejected.forEach((r, index) => {
        if (!q || rejectText(r).toLowerCase().includes(q)) items.push({ kind: "reject", item: r, index });
      });
    }
    return items;
  }

  function renderFilters() {
    for (const button of $("filters").querySelectorAll("button")) {
      const filter = button.dataset.filter;
      button.textContent = `${FILTERS[filter]} (${listed(filter).length})`;
      button.setAttribute("aria-pressed", String(filter === state.filter));
    }
  }

  function renderList() {
    const list = $("trajectory-list");
    list.replaceChildren();
    const items = listed(state.filter);
    for (const { kind, item, index } of items) {
      if (kind === "trajectory") {
        const s = status(item);
        list.append(el("li", { class: `item ${s}`, "data-id": item.id },
          el("button", { type: "button", onclick: () => open(item.id), "aria-current": state.open === item.id },
            el("code", { text: item.id.slice(0, 12) }), " ",
            el("span", { class: `badge ${s}`, text: FILTERS[s] }), " ",
            el("span", { class: "question", text: item.question.slice(0, 140) }))));
      } else {
        list.append(el("li", { class: "item rejected", "data-reject": index },
          el("button", { type: "button", onclick: () => openReject(index) },
            el("code", { text: `${item.file}:${item.line}` }), " ",
            el("span", { class: "badge rejected", text: item.code }))));
      }
    }
    $("list-count").textContent = `${count(items.length)} shown`;
    renderFilters();
  }

  // -- one trajectory ---------------------------------------------------------------------------
  function chart(c) {
    const drops = c[DROPS], eps = epsilon(), block = blocker(c);
    const step = 34, left = 30, top = 10, bottom = 22, height = 120;
    const right = left + step * drops.length + 6, width = right + 80;
    const finite = drops.filter((d) => d !== null);
    let lo = Math.min(0, ...finite), hi = Math.max(eps, ...finite);
    if (!(hi > lo)) hi = lo + 1;
    const pad = (hi - lo) * 0.08;
    hi += pad;
    if (lo < 0) lo -= pad;
    const y = (v) => top + ((hi - v) / (hi - lo)) * (height - top - bottom);
    const root = svg("svg", { class: "drops", width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
    root.append(svg("title", {}, `drops d_j of the actions checked when removing turn ${c[TURN]}'s reasoning, against ε = ${state.eps}`));
    root.append(svg("line", { class: "axis", x1: left, x2: right, y1: y(0), y2: y(0) }));
    root.append(svg("text", { class: "tick", x: left - 4, y: y(0) + 4, "text-anchor": "end" }, "0"));
    drops.forEach((d, k) => {
      const j = c[TURN] + k, x = left + step * k + 6;
      const over = d === null || d > eps;
      let cls = over ? "bar over" : "bar within";
      if (j === block) cls += " blocker";
      if (d === null) {
        root.append(svg("rect", { class: `${cls} nonfinite`, x, y: top, width: step - 12, height: height - top - bottom }));
      } else {
        const y0 = y(0), y1 = y(d);
        root.append(svg("rect", { class: cls, x, y: Math.min(y0, y1), width: step - 12, height: Math.max(1, Math.abs(y1 - y0)) }));
      }
      root.lastChild.append(svg("title", {}, `action of turn ${j}: d = ${fmt(d)}`));
      root.append(svg("text", { class: "tick", x: x + (step - 12) / 2, y: height - 6, "text-anchor": "middle" }, `a${j}`));
    });
    root.append(svg("line", { class: "epsilon", x1: left, x2: right, y1: y(eps), y2: y(eps) }));
    root.append(svg("text", { class: "tick epsilon-label", x: right + 4, y: y(eps) + 4 }, `ε = ${state.eps}`));
    return root;
  }

  function verdict(c, turns) {
    const drops = c[DROPS];
    if (c[REASON] === "empty_reasoning") return "reasoning already empty: not a candidate, nothing scored";
    const worst = drops.reduce((best, d, k) => (d !== null && (best === null || d > drops[best]) ? k : best), null);
    const largest = worst === null ? "" : ` (largest d = ${fmt(drops[worst])} at the action of turn ${c[TURN] + worst})`;
    if (c[ACCEPTED]) {
      if (drops.some((d) => d !== null && d > epsilon())) {
        return `removed: its own action's drop d = ${fmt(drops[0])} ≤ ε; the later actions did not decide (a local-only cover)`;
      }
      return `removed: every action checked lost at most ε${largest}`;
    }
    const j = blocker(c);
    if (j === null) return `kept (${c[REASON]})${largest}`;
    const d = drops[j - c[TURN]];
    const others = drops.map((x, k) => c[TURN] + k).filter((t) => t !== j && (drops[t - c[TURN]] === null || drops[t - c[TURN]] > epsilon()));
    let text = d === null
      ? `kept: blocked by the action of turn ${j}, whose score was not finite`
      : `kept: blocked by the action of turn ${j}, which lost d = ${fmt(d)} > ε`;
    if (others.length) text += `; also over ε: turn ${others.join(", ")}`;
    if (turns !== null && c[TURN] + drops.length < turns) text += " (the later actions were not scored: early reject)";
    return text;
  }

  function field(name, text, removed) {
    const body = removed ? el("del", { text }) : el("span", { text: text || "(empty)" });
    return el("div", { class: `field ${name}` }, el("span", { class: "label", text: name }), el("div", { class: "text" }, body));
  }

  function open(id) {
    state.open = id;
    const t = trajectories.get(id);
    const view = $("trajectory-view");
    const byTurn = new Map(candidates(id).map((c) => [c[TURN], c]));
    const hasText = t.turns.length > 0;
    const turns = hasText ? t.turns.length : Math.max(0, ...byTurn.keys()) + 1;
    const removed = [...byTurn.values()].filter((c) => c[ACCEPTED]);
    const scored = [...byTurn.values()].filter((c) => c[REASON] !== "empty_reasoning");
    const tokens = removed.reduce((n, c) => n + c[TOKENS], 0);
    view.replaceChildren(
      el("h3", { class: "question", text: t.question || "(question not in this page)" }),
      el("p", { class: "meta" }, "id ", el("code", { class: "trajectory-id", text: t.id }),
        t.environment ? ` · environment ${t.environment}` : "", ` · ${turns} turns`),
      el("p", { class: `outcome ${status(t)}`, text: t.too_long
        ? `Not scored: refused as too_long (${t.too_long})`
        : `At ε = ${state.eps}: reasoning removed in ${removed.length} of ${scored.length} candidate turns (${count(tokens)} reasoning tokens)` }),
    );
    if (!hasText) view.append(el("p", { class: "note", text: "The trajectory's text is not in this page: the report had no trajectories object to read it from." }));
    for (let i = 0; i < turns; i++) {
      const c = byTurn.get(i);
      const gone = Boolean(c && c[ACCEPTED]);
      const [reasoning, action, observation] = hasText ? t.turns[i] : ["", "", ""];
      const badge = i === 0 ? "turn 0: never a candidate" : gone ? "reasoning removed"
        : !c ? "not a candidate" : c[REASON] === "empty_reasoning" ? "reasoning empty" : "reasoning kept";
      const turn = el("article", { class: `turn ${gone ? "removed" : "kept"}`, "data-turn": i },
        el("h4", {}, `Turn ${i} `, el("span", { class: `badge ${gone ? "removed" : "kept"}`, text: badge })));
      if (hasText) turn.append(field("reasoning", reasoning, gone), field("action", action), field("observation", observation));
      if (c) {
        const box = el("div", { class: "candidate" }, el("p", { class: "verdict", text: verdict(c, hasText ? turns : null) }));
        if (c[DROPS].length) {
          box.append(chart(c), el("p", { class: "drop-values",
            text: "d: " + c[DROPS].map((d, k) => `turn ${c[TURN] + k} ${fmt(d)}`).join(", ") }));
        }
        turn.append(box);
      }
      view.append(turn);
    }
    renderList();
    try {
      history.replaceState(null, "", `#trajectory=${encodeURIComponent(id)}`);
    } catch (_) { /* a page opened where the history cannot change: the link is only a convenience */ }
  }

  function openReject(index) {
    state.open = null;
    const r = data.rejected[index];
    $("trajectory-view").replaceChildren(
      el("h3", { text: `Rejected line ${r.file}:${r.line}` }),
      el("p", {}, "code ", el("code", { text: r.code }), r.field ? ` · field ${r.field}` : ""),
      el("pre", { class: "text", text: r.message || "" }),
      el("p", { class: "note", text: "A rejected line never became a trajectory: the cover did not see it (rejects.parquet lists every one)." }),
    );
    renderList();
  }

  // -- the page around them ---------------------------------------------------------------------
  function renderFacts() {
    const f = data.runs[state.eps] || {};
    const parts = [];
    if (f.model_digest) parts.push(`model ${f.model_digest.slice(0, 16)}`);
    if (f.backend) parts.push(`backend ${f.backend}`);
    if (f.render_modes && f.render_modes.length) parts.push(`render ${f.render_modes.join(", ")}`);
    parts.push(`reasoning removed in ${count(f.removed || 0)} of ${count(f.candidates || 0)} candidate turns of ${count(f.trajectories || 0)} scored trajectories`);
    $("run-facts").textContent = parts.join(" · ");
  }

  function renderNote() {
    const c = data.counts, l = data.limits;
    let text = c.left_out
      ? `This page holds ${count(c.shown)} of the run's ${count(c.trajectories)} trajectories (the first ${count(l.first)} in input order, up to ${count(l.largest)} with the largest drops and up to ${count(l.too_long)} refused as too_long); ${count(c.left_out)} are left out. The full data is in decisions.parquet, compressed.parquet and rejects.parquet.`
      : `All ${count(c.trajectories)} trajectories of the run are here.`;
    if (c.rejected) text += ` Rejected input lines: ${count(c.rejected)}${c.rejected > c.rejected_shown ? ` (the first ${count(c.rejected_shown)} listed)` : ""}.`;
    if (!c.with_text && c.shown) text += " The trajectories' text is not in this page (the report had no trajectories object to read it from).";
    $("sample-note").textContent = text;
  }

  function start() {
    const select = $("epsilon");
    for (const label of data.epsilons) select.append(el("option", { value: label, text: label }));
    select.value = state.eps;
    select.disabled = data.epsilons.length < 2;
    select.addEventListener("change", () => {
      state.eps = select.value;
      renderFacts();
      if (state.open !== null) open(state.open);
      else renderList();
    });
    $("search").addEventListener("input", (event) => {
      state.query = event.target.value;
      renderList();
    });
    for (const button of $("filters").querySelectorAll("button")) {
      button.addEventListener("click", () => {
        state.filter = button.dataset.filter;
        renderList();
      });
    }
    renderNote();
    renderFacts();
    renderList();
    const linked = decodeURIComponent((location.hash.match(/^#trajectory=(.+)$/) || [])[1] || "");
    if (trajectories.has(linked)) open(linked);
  }

  start();
})();
