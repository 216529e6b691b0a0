// modtrace report: draws the page from the JSON model embedded in #modtrace-data.
// Plain DOM and canvas, no libraries, nothing fetched.
(function () {
  "use strict";

  var DATA = JSON.parse(document.getElementById("modtrace-data").textContent);
  var PHASES = DATA.phases;
  var STATUSES = DATA.statuses;
  var SOURCE_MARKS = DATA.source_marks;  // source -> [mark, what it means], as modtrace tree shows them
  var COLORS = { forward: "#3b7dd8", backward: "#e0803a", recompute: "#3aa66b", backward_call: "#9b59b6" };
  var ROW_H = 18;
  var LANE_HEAD = 18;
  var AXIS_H = 22;

  // -- helpers ---------------------------------------------------------------

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        if (k === "text") node.textContent = attrs[k];
        else if (k === "cls") node.className = attrs[k];
        else node.setAttribute(k, attrs[k]);
      });
    }
    (children || []).forEach(function (c) {
      node.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    });
    return node;
  }

  // Numbers are written as the CLI writes them (renderers/tree.py format_ns, renderers/diff.py
  // fmt_time, fmt_ratio, fmt_p): three significant digits, so a number reads the same in both.
  var NB = "\u00a0";  // between a number and its unit: a cell may wrap between numbers, never inside one

  function fmtG(v, digits) {
    // Python's format(v, "." + digits + "g")
    if (v === 0) return "0";
    var exp = Math.floor(Math.log10(Math.abs(Number(v.toPrecision(digits)))));
    if (exp < -4 || exp >= digits) {
      var m = v.toExponential(digits - 1).split("e");
      var mant = m[0].indexOf(".") >= 0 ? m[0].replace(/0+$/, "").replace(/\.$/, "") : m[0];
      var e = parseInt(m[1], 10);
      return mant + "e" + (e < 0 ? "-" : "+") + (Math.abs(e) < 10 ? "0" : "") + Math.abs(e);
    }
    var fixed = v.toFixed(Math.max(0, digits - 1 - exp));
    return fixed.indexOf(".") >= 0 ? fixed.replace(/0+$/, "").replace(/\.$/, "") : fixed;
  }

  function fmtNs(ns) {
    if (ns === null || ns === undefined || isNaN(ns)) return "";
    var units = [["s", 1e9], ["ms", 1e6], ["\u00b5s", 1e3]];
    for (var i = 0; i < units.length; i++) {
      if (Math.abs(ns) >= units[i][1]) return fmtG(ns / units[i][1], 3) + NB + units[i][0];
    }
    return ns.toFixed(0) + NB + "ns";
  }

  function fmtUs(us, signed) {
    if (us === null || us === undefined) return "";
    var sign = signed && us > 0 ? "+" : (us < 0 ? "-" : "");
    var v = Math.abs(us);
    var text = v >= 1e6 ? fmtG(v / 1e6, 3) + NB + "s" : v >= 1000 ? fmtG(v / 1000, 3) + NB + "ms" : fmtG(v, 3) + NB + "\u00b5s";
    return sign + text;
  }

  function fmtRatio(ratio) {
    if (ratio === null || ratio === undefined) return "new";
    var pct = (ratio - 1) * 100;
    return (pct >= 0 ? "+" : "") + pct.toFixed(1) + "%";
  }

  function fmtP(p) {
    if (p === null || p === undefined) return "";
    return p < 1e-6 ? "<1e-6" : fmtG(p, 2);
  }

  function fmtNum(v, digits) {
    if (v === null || v === undefined) return "";
    if (typeof v !== "number") return String(v);
    return digits === undefined ? v.toLocaleString("en-US") : v.toFixed(digits);
  }

  // Text that may break after these characters only (as well as at spaces): a module name
  // wraps between its parts, never inside one.
  function breakable(text, chars) {
    var frag = document.createDocumentFragment();
    var re = chars || /[.]/;
    var part = "";
    for (var i = 0; i < text.length; i++) {
      part += text[i];
      if (re.test(text[i]) && i < text.length - 1) {
        frag.appendChild(document.createTextNode(part));
        frag.appendChild(document.createElement("wbr"));
        part = "";
      }
    }
    if (part) frag.appendChild(document.createTextNode(part));
    return frag;
  }

  // Module names are shown without the dotted prefix they all share (the model's class, as a
  // rule); the whole name is in each cell's title, shown on hover.
  function commonPrefix(names) {
    var parts = null;
    names.forEach(function (n) {
      if (n === null || n === undefined) return;
      var p = String(n).split(".");
      if (parts === null) { parts = p; return; }
      var k = 0;
      while (k < parts.length && k < p.length && parts[k] === p[k]) k++;
      parts = parts.slice(0, k);
    });
    return parts && parts.length ? parts.join(".") : "";
  }

  function shortName(fqn) {
    if (fqn === null || fqn === undefined) return "";
    var s = String(fqn);
    return PREFIX && s.indexOf(PREFIX + ".") === 0 ? s.slice(PREFIX.length + 1) : s;
  }

  // columns: [{key, label, fmt, num, cls, title (what the number is), name (a module name),
  // breaks (characters a long value may wrap after)}]
  function table(columns, rows, rowClass) {
    var head = el("tr", null, columns.map(function (c) {
      var attrs = { cls: c.num ? "num" : "", text: c.label };
      if (c.title) attrs.title = c.title;
      return el("th", attrs);
    }));
    var body = rows.map(function (r) {
      var tr = el("tr", rowClass ? { cls: rowClass(r) } : null, columns.map(function (c) {
        var v = c.get ? c.get(r) : r[c.key];
        var text = c.fmt ? c.fmt(v, r) : (v === null || v === undefined ? "" : String(v));
        var cls = [c.num ? "num" : "", c.name ? "fqn" : "", c.cls ? (typeof c.cls === "function" ? c.cls(v, r) : c.cls) : ""].join(" ").trim();
        var td = el("td", cls ? { cls: cls } : null);
        if (c.name && v !== null && v !== undefined) {
          // a part longer than the column is cut with an ellipsis: the title has it whole
          td.title = String(v);
          td.appendChild(el("div", { cls: "name" }, [el("span", { cls: "n" }, [breakable(shortName(v))])]));
        } else if (c.ident && v !== null && v !== undefined) {
          td.title = text;
          td.appendChild(el("span", { cls: "n", text: text }));
        } else if (c.breaks) {
          td.appendChild(breakable(text, c.breaks));
        } else {
          td.textContent = text;
        }
        return td;
      }));
      return tr;
    });
    return el("table", null, [el("thead", null, [head]), el("tbody", null, body)]);
  }

  function scroll(node) { return el("div", { cls: "scroll" }, [node]); }

  function hashHue(s) {
    var h = 0;
    for (var i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) | 0;
    return Math.abs(h);
  }

  function shade(hex, name) {
    // Same phase, a slightly different lightness per module, so neighbours differ.
    var r = parseInt(hex.slice(1, 3), 16), g = parseInt(hex.slice(3, 5), 16), b = parseInt(hex.slice(5, 7), 16);
    var f = 0.78 + (hashHue(name) % 45) / 100;
    function c(x) { return Math.max(0, Math.min(255, Math.round(x * f))); }
    return "rgb(" + c(r) + "," + c(g) + "," + c(b) + ")";
  }

  function setupCanvas(canvas, cssHeight) {
    var dpr = window.devicePixelRatio || 1;
    var width = canvas.parentNode.clientWidth || 800;
    if (canvas.parentNode.id !== "flame-wrap") width = canvas.clientWidth || width;
    canvas.style.height = cssHeight + "px";
    canvas.width = Math.max(1, Math.floor(width * dpr));
    canvas.height = Math.max(1, Math.floor(cssHeight * dpr));
    var ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return { ctx: ctx, w: width, h: cssHeight };
  }

  // -- header and summary ------------------------------------------------------

  var run = DATA.run;
  document.getElementById("title").textContent = "modtrace report: " + (run.name || "run " + run.id);
  document.getElementById("subtitle").textContent = [
    run.status, run.started_at ? "started " + run.started_at : null,
    run.command ? run.command : null,
  ].filter(Boolean).join(" \u00b7 ");

  // What each number is (docs/schema.md, "Glossary"): one name per quantity, the CLI's.
  var GLOSSARY = {
    stepTime: "step time: the time inside module calls of one step, the summed duration of its root calls (every phase); forward + backward + recompute split it by self time",
    wallTime: "wall time: from the step's first call to the next step's first call, so it includes the optimizer step and data loading after the backward",
    outside: "outside modules: wall time - step time",
    selfStep: "self/step: median, over the steps the module ran in, of its self time summed over its calls in the step (as in modtrace tree)",
    inclStep: "incl/step: median, over the steps the module ran in, of its inclusive time summed over its calls in the step (as in modtrace tree)",
    calls: "calls: every call of the module in that phase, all steps (as in modtrace tree)",
    selfTotal: "self total: self time summed over every call and step",
    inclTotal: "incl total: inclusive time summed over every call and step",
    flopsStep: "FLOPs/step: median, over the counted steps the module ran in, of its inclusive FLOPs summed over its calls in the step (as in modtrace tree; a lower bound where it ran ops with no FLOP formula)",
    gflops: "GFLOP/s: achieved throughput, FLOPs/step over incl/step (as in modtrace tree)",
    intensity: "FLOP/B: arithmetic intensity, FLOPs per byte of its ops' tensor inputs and outputs",
    peak: "% peak: GFLOP/s as a percentage of the peak given (--peak-tflops)",
    kept: "kept/step: median, over the counted steps, of the tensor memory its calls allocated and still held at their exit (in forward: what it keeps for backward and returns), summed over its calls in the step (as in modtrace tree)",
    peakMem: "peak mem: the most live tensor memory any of its calls reached above the level at its entry, on counted steps (as in modtrace tree)",
    source: "where the time comes from: blank when measured by module hooks; marked when attributed from compiled kernels (see the note under the table)",
    pHolm: "p (Holm): two-sided Mann-Whitney p over the compared steps, Holm-adjusted over every module and phase compared; the verdict uses this one (the JSON also has the unadjusted p_value)",
  };

  var steps = DATA.steps;
  var mySteps = steps.filter(function (s) { return s.rank === DATA.rank; });
  function medianOf(key) {
    var v = mySteps.map(function (s) { return s[key]; }).sort(function (a, b) { return a - b; });
    return v.length ? v[Math.floor((v.length - 1) / 2)] : null;
  }
  var sev = { error: 0, warning: 0, info: 0 };
  DATA.issues.counts.forEach(function (c) { sev[c.severity] = (sev[c.severity] || 0) + c.n; });

  var allNames = DATA.flame.names.concat(DATA.top_modules.map(function (r) { return r.fqn; }));
  if (DATA.diff) {
    DATA.diff.timing.forEach(function (r) { allNames.push(r.fqn); });
    DATA.diff.structure.forEach(function (r) { if (r.fqn) allNames.push(r.fqn); });
  }
  var PREFIX = commonPrefix(allNames);

  var cards = [
    ["status", run.status || "", run.status === "failed" ? "bad" : ""],
    ["steps", fmtNum(mySteps.length), ""],
    ["median step time", fmtNs(medianOf("step_ns")), "", GLOSSARY.stepTime],
    ["median wall time", fmtNs(medianOf("wall_ns")), "", GLOSSARY.wallTime],
    ["clock", run.clock || "host", ""],
    ["spans", fmtNum(DATA.span_count), ""],
    ["ranks", fmtNum(run.ranks || DATA.ranks.length), ""],
    ["nesting errors", fmtNum(sev.error), sev.error ? "bad" : ""],
    ["warnings", fmtNum(sev.warning), sev.warning ? "warn" : ""],
  ];
  if (DATA.diff) {
    var s = DATA.diff.summary;
    cards.push(["regressions", fmtNum(s.regressions), s.regressions ? "bad" : ""]);
    if (s.step_ratio !== null) {
      cards.push(["step time vs base", fmtRatio(s.step_ratio), DATA.diff.step.verdict === "regression" ? "bad" : "",
        "median step time over the compared steps, candidate against base (as modtrace diff's headline)"]);
    }
  }
  var summary = document.getElementById("summary");
  cards.forEach(function (c) {
    var card = el("div", { cls: "card " + c[2] }, [el("div", { cls: "v", text: c[1] }), el("div", { cls: "k", text: c[0] })]);
    if (c[3]) card.title = c[3];
    summary.appendChild(card);
  });
  if (run.compiled_note) {
    // compiled modules hide their inner calls, or had them attributed from kernels: say so above
    // everything that shows them
    summary.parentNode.insertBefore(el("p", { cls: "note", text: run.compiled_note }), summary.nextSibling);
  }
  if (PREFIX) {
    summary.parentNode.insertBefore(el("p", { cls: "note", id: "prefix-note", text: "Module names below leave out the prefix " +
      PREFIX + ". that they all share; hover a name for the whole." }), summary.nextSibling);
  }

  // -- flame chart ---------------------------------------------------------------

  var flame = DATA.flame;
  var names = flame.names;
  var canvas = document.getElementById("flame");
  var tooltip = document.getElementById("tooltip");
  var select = document.getElementById("step-select");
  var state = { step: null, v0: 0, v1: 1, lanes: [], boxes: [] };

  var legend = document.getElementById("legend");
  PHASES.forEach(function (p) {
    legend.appendChild(el("span", { cls: "sw", style: "background:" + COLORS[p] }));
    legend.appendChild(document.createTextNode(p));
  });
  // Spans attributed from compiled kernels (not measured by hooks) are outlined dashed.
  var ATTRIBUTED = STATUSES.indexOf("attributed");
  if (flame.steps.some(function (s) { return s.spans.some(function (sp) { return sp[7] === ATTRIBUTED; }); })) {
    legend.appendChild(el("span", { cls: "sw attributed" }));
    legend.appendChild(document.createTextNode("attributed from compiled kernels"));
  }

  var stepRow = {};
  mySteps.forEach(function (s) { stepRow[s.step] = s; });
  flame.steps.forEach(function (s, i) {
    var row = stepRow[s.step];
    var label = "step " + s.step + (row ? ": step time " + fmtNs(row.step_ns) + ", wall time " + fmtNs(row.wall_ns) : "") +
      ", " + s.spans.length + " spans";
    var opt = el("option", { value: String(i), text: label });
    if (s.step === DATA.default_step) opt.selected = true;
    select.appendChild(opt);
  });

  function layout(step) {
    // One lane per (thread, band); band 0 forward, 1 backward with its recomputes and backward calls.
    var keys = {};
    step.spans.forEach(function (sp) {
      var k = sp[4] + ":" + sp[3];
      keys[k] = Math.max(keys[k] === undefined ? 0 : keys[k], sp[2]);
    });
    var lanes = Object.keys(keys).map(function (k) {
      var parts = k.split(":");
      return { thread: +parts[0], band: +parts[1], rows: keys[k] + 1 };
    }).sort(function (a, b) { return a.thread - b.thread || a.band - b.band; });
    var y = AXIS_H;
    lanes.forEach(function (l) {
      l.y = y;
      l.label = "thread " + l.thread + " \u00b7 " + (l.band === 0 ? "forward" : "backward");
      y += LANE_HEAD + l.rows * ROW_H + 6;
    });
    return { lanes: lanes, height: Math.max(y, 80) };
  }

  function drawFlame() {
    if (!flame.steps.length) {
      var empty = setupCanvas(canvas, 60);
      empty.ctx.fillStyle = "#5d6778";
      empty.ctx.font = "13px system-ui, sans-serif";
      empty.ctx.fillText("no spans recorded", 12, 34);
      return;
    }
    var step = flame.steps[state.step];
    var lay = layout(step);
    state.lanes = lay.lanes;
    var c = setupCanvas(canvas, lay.height);
    var ctx = c.ctx, W = c.w;
    var span = Math.max(state.v1 - state.v0, 1);
    var scale = W / span;
    ctx.clearRect(0, 0, W, c.h);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";

    // time axis
    ctx.fillStyle = "#f5f7fa";
    ctx.fillRect(0, 0, W, AXIS_H);
    var target = span / Math.max(2, Math.floor(W / 110));
    var pow = Math.pow(10, Math.floor(Math.log10(target)));
    var tick = [1, 2, 5, 10].map(function (m) { return m * pow; }).filter(function (t) { return t >= target; })[0] || pow * 10;
    ctx.strokeStyle = "#dde2ea";
    ctx.fillStyle = "#5d6778";
    for (var t = Math.ceil(state.v0 / tick) * tick; t <= state.v1; t += tick) {
      var x = (t - state.v0) * scale;
      ctx.beginPath(); ctx.moveTo(x + 0.5, AXIS_H - 6); ctx.lineTo(x + 0.5, c.h); ctx.stroke();
      ctx.fillText(fmtNs(t), x + 3, AXIS_H / 2);
    }

    var laneOf = {};
    lay.lanes.forEach(function (l) {
      laneOf[l.thread + ":" + l.band] = l;
      ctx.fillStyle = "#1d2430";
      ctx.font = "600 11px system-ui, sans-serif";
      ctx.fillText(l.label, 4, l.y + LANE_HEAD / 2);
    });
    ctx.font = "11px system-ui, sans-serif";
    var boxes = [];
    step.spans.forEach(function (sp) {
      var x0 = sp[0], dur = sp[1];
      if (x0 + dur < state.v0 || x0 > state.v1) return;
      var x = (x0 - state.v0) * scale;
      var w = dur * scale;
      if (w < 0.4) return;
      var lane = laneOf[sp[4] + ":" + sp[3]];
      var y = lane.y + LANE_HEAD + sp[2] * ROW_H;
      var name = shortName(names[sp[5]] || "?");
      var phase = PHASES[sp[6]];
      var status = STATUSES[sp[7]];
      ctx.fillStyle = shade(COLORS[phase] || "#888888", name);
      ctx.fillRect(x, y, Math.max(w - 0.5, 0.6), ROW_H - 2);
      if (status === "unclosed" || status === "error" || status === "no_enter") {
        ctx.strokeStyle = "#c8312f"; ctx.lineWidth = 2;
        ctx.strokeRect(x + 1, y + 1, Math.max(w - 2, 1), ROW_H - 4);
        ctx.lineWidth = 1;
      } else if (status === "attributed") {
        ctx.strokeStyle = "#1d2430"; ctx.setLineDash([3, 2]);
        ctx.strokeRect(x + 0.5, y + 0.5, Math.max(w - 1.5, 0.5), ROW_H - 3);
        ctx.setLineDash([]);
      }
      if (w > 28) {
        var parts = name.split(".");
        var label = parts.length > 1 && /^[0-9]+$/.test(parts[parts.length - 1]) ? parts.slice(-2).join(".") : parts[parts.length - 1];
        var full = ctx.measureText(name).width < w - 6 ? name : label;
        var shown = full;
        if (ctx.measureText(shown).width > w - 6) {
          while (shown.length > 1 && ctx.measureText(shown + "\u2026").width > w - 6) shown = shown.slice(0, -1);
          shown += "\u2026";
        }
        ctx.fillStyle = "#ffffff";
        ctx.save();
        ctx.beginPath(); ctx.rect(x, y, w, ROW_H); ctx.clip();
        ctx.fillText(shown, Math.max(x, 0) + 3, y + (ROW_H - 2) / 2);
        ctx.restore();
      }
      boxes.push({ x: x, y: y, w: w, sp: sp });
    });
    state.boxes = boxes;
  }

  function showStep(index) {
    tooltip.hidden = true;
    state.step = index;
    state.v0 = 0;
    state.v1 = flame.steps.length ? flame.steps[index].duration_ns : 1;
    drawFlame();
    drawStepsChart();
  }

  function hit(ev) {
    var rect = canvas.getBoundingClientRect();
    var x = ev.clientX - rect.left, y = ev.clientY - rect.top;
    for (var i = state.boxes.length - 1; i >= 0; i--) {
      var b = state.boxes[i];
      if (x >= b.x && x <= b.x + Math.max(b.w, 2) && y >= b.y && y < b.y + ROW_H - 2) return { box: b, x: x, y: y };
    }
    return null;
  }

  canvas.addEventListener("mousemove", function (ev) {
    var h = hit(ev);
    if (!h) { tooltip.hidden = true; return; }
    var sp = h.box.sp;
    tooltip.textContent = [
      names[sp[5]],
      PHASES[sp[6]] + " \u00b7 " + STATUSES[sp[7]] + " \u00b7 thread " + sp[4],
      "duration " + fmtNs(sp[1]) + (sp[8] !== null ? " \u00b7 self " + fmtNs(sp[8]) : ""),
      "starts at +" + fmtNs(sp[0]) + " \u00b7 call " + sp[9],
    ].join("\n");
    tooltip.hidden = false;
    var wrap = canvas.parentNode.getBoundingClientRect();
    var left = Math.min(h.x + 14, wrap.width - 300);
    tooltip.style.left = Math.max(left, 0) + "px";
    tooltip.style.top = (h.y + 16) + "px";
  });
  canvas.addEventListener("mouseleave", function () { tooltip.hidden = true; });
  canvas.addEventListener("click", function (ev) {
    var h = hit(ev);
    if (!h) return;
    var sp = h.box.sp, pad = sp[1] * 0.02;
    state.v0 = Math.max(0, sp[0] - pad);
    state.v1 = sp[0] + sp[1] + pad;
    drawFlame();
  });
  function resetZoom() {
    state.v0 = 0;
    state.v1 = flame.steps.length ? flame.steps[state.step].duration_ns : 1;
    drawFlame();
  }
  canvas.addEventListener("dblclick", resetZoom);
  document.getElementById("zoom-reset").addEventListener("click", resetZoom);
  select.addEventListener("change", function () { showStep(+select.value); });

  // -- per-step times ------------------------------------------------------------

  var stepsCanvas = document.getElementById("steps-chart");
  function drawStepsChart() {
    var c = setupCanvas(stepsCanvas, 160);
    var ctx = c.ctx, W = c.w, H = c.h;
    ctx.clearRect(0, 0, W, H);
    if (!mySteps.length) return;
    var max = 0;
    mySteps.forEach(function (s) { max = Math.max(max, s.step_ns, s.wall_ns); });
    var left = 64, bottom = 20, top = 10;
    var bw = (W - left - 8) / mySteps.length;
    var yscale = (H - bottom - top) / (max || 1);
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = "#5d6778";
    ctx.textBaseline = "middle";
    ctx.fillText(fmtNs(max), 4, top + 4);
    ctx.fillText("0", 4, H - bottom);
    var current = flame.steps.length && state.step !== null ? flame.steps[state.step].step : null;
    mySteps.forEach(function (s, i) {
      var x = left + i * bw;
      var w = Math.max(bw - (bw > 4 ? 2 : 0), 1);
      var fy = s.forward_ns * yscale, by = s.backward_ns * yscale, ry = s.recompute_ns * yscale;
      var y = H - bottom;
      ctx.fillStyle = COLORS.forward; ctx.fillRect(x, y - fy, w, fy); y -= fy;
      ctx.fillStyle = COLORS.backward; ctx.fillRect(x, y - by, w, by); y -= by;
      ctx.fillStyle = COLORS.recompute; ctx.fillRect(x, y - ry, w, ry);
      if (s.step === current) {
        ctx.strokeStyle = "#1d2430"; ctx.lineWidth = 2;
        ctx.strokeRect(x, top, w, H - bottom - top);
        ctx.lineWidth = 1;
      }
    });
    ctx.fillStyle = "#5d6778";
    var every = Math.max(1, Math.ceil(mySteps.length / Math.max(1, Math.floor((W - left) / 40))));
    mySteps.forEach(function (s, i) {
      if (i % every === 0) ctx.fillText(String(s.step), left + i * bw + 1, H - bottom / 2);
    });
  }
  stepsCanvas.addEventListener("click", function (ev) {
    var rect = stepsCanvas.getBoundingClientRect();
    var left = 64, bw = (rect.width - left - 8) / Math.max(mySteps.length, 1);
    var i = Math.floor((ev.clientX - rect.left - left) / bw);
    if (i < 0 || i >= mySteps.length) return;
    for (var k = 0; k < flame.steps.length; k++) {
      if (flame.steps[k].step === mySteps[i].step) { select.value = String(k); showStep(k); return; }
    }
  });

  var multiRank = DATA.ranks.length > 1;
  var stepCols = (multiRank ? [{ key: "rank", label: "rank", num: true }] : []).concat([
    { key: "step", label: "step", num: true },
    { key: "step_ns", label: "step time", num: true, fmt: fmtNs, title: GLOSSARY.stepTime },
    { key: "forward_ns", label: "forward", num: true, fmt: fmtNs, title: "forward: self time of the step's forward calls (part of the step time)" },
    { key: "backward_ns", label: "backward", num: true, fmt: fmtNs, title: "backward: self time of the step's backward calls (part of the step time)" },
    { key: "recompute_ns", label: "recompute", num: true, fmt: fmtNs, title: "recompute: self time of the step's activation-checkpoint recomputes (part of the step time)" },
    { key: "wall_ns", label: "wall time", num: true, fmt: fmtNs, title: GLOSSARY.wallTime },
    { key: "outside_ns", label: "outside modules", num: true, fmt: fmtNs, title: GLOSSARY.outside,
      get: function (r) { return r.wall_ns - r.step_ns; } },
    { key: "spans", label: "spans", num: true, fmt: function (v) { return fmtNum(v); } },
    { key: "unclosed", label: "unclosed", num: true, fmt: function (v) { return v ? fmtNum(v) : ""; }, cls: function (v) { return v ? "sev-error" : ""; } },
  ]);
  document.getElementById("steps-table").appendChild(scroll(table(stepCols, steps)));

  // -- modules by self time ------------------------------------------------------

  var mods = DATA.top_modules;
  // Work columns only for a run with counted steps; % peak only when a peak was given.
  var modWork = [];
  if (mods.some(function (r) { return r.flops_per_step !== null && r.flops_per_step !== undefined; })) {
    var fmtCount = function (v) {
      if (v === null || v === undefined) return "";
      var pre = [["P", 1e15], ["T", 1e12], ["G", 1e9], ["M", 1e6], ["k", 1e3]];
      for (var i = 0; i < pre.length; i++) {
        if (Math.abs(v) >= pre[i][1]) return fmtG(v / pre[i][1], 3) + NB + pre[i][0];
      }
      return v.toFixed(0);
    };
    var fmt3 = function (v) { return v === null || v === undefined ? "" : fmtG(v, 3); };
    modWork = [
      { key: "flops_per_step", label: "FLOPs/step", num: true, fmt: fmtCount, title: GLOSSARY.flopsStep },
      { key: "gflop_per_s", label: "GFLOP/s", num: true, fmt: fmt3, title: GLOSSARY.gflops },
      { key: "flop_per_byte", label: "FLOP/B", num: true, fmt: fmt3, title: GLOSSARY.intensity },
    ];
    if (mods.some(function (r) { return r.kept_mem_per_step !== null && r.kept_mem_per_step !== undefined; })) {
      var fmtBytes = function (v) {
        if (v === null || v === undefined) return "";
        var units = [["TiB", 1099511627776], ["GiB", 1073741824], ["MiB", 1048576], ["KiB", 1024]];
        for (var i = 0; i < units.length; i++) {
          if (Math.abs(v) >= units[i][1]) return fmtG(v / units[i][1], 3) + NB + units[i][0];
        }
        return v.toFixed(0) + NB + "B";
      };
      modWork.push({ key: "kept_mem_per_step", label: "kept/step", num: true, fmt: fmtBytes, title: GLOSSARY.kept });
      modWork.push({ key: "peak_mem_bytes", label: "peak mem", num: true, fmt: fmtBytes, title: GLOSSARY.peakMem });
    }
    if (DATA.peak_tflops) {
      modWork.push({ key: "peak_percent", label: "% peak", num: true,
                     fmt: function (v) { return v === null || v === undefined ? "" : v.toFixed(1); }, title: GLOSSARY.peak });
    }
  }
  var maxSelf = mods.reduce(function (m, r) { return Math.max(m, r.self_total_ns || 0); }, 0) || 1;
  document.getElementById("modules-table").appendChild(table([
    { key: "fqn", label: "module", name: true },
    { key: "module_type", label: "type", ident: true, cls: "ident" },
    { key: "phase", label: "phase" },
    { key: "calls", label: "calls", num: true, fmt: function (v) { return fmtNum(v); }, title: GLOSSARY.calls },
    { key: "self_median_ns", label: "self/step", num: true, fmt: fmtNs, title: GLOSSARY.selfStep },
    { key: "inclusive_median_ns", label: "incl/step", num: true, fmt: fmtNs, title: GLOSSARY.inclStep },
    { key: "self_total_ns", label: "self total", num: true, fmt: fmtNs, title: GLOSSARY.selfTotal },
    { key: "inclusive_total_ns", label: "incl total", num: true, fmt: fmtNs, title: GLOSSARY.inclTotal },
    { key: "source", label: "", fmt: function (v) { return SOURCE_MARKS[v] ? SOURCE_MARKS[v][0] : ""; }, title: GLOSSARY.source },
  ], mods));
  var sources = {};
  mods.forEach(function (r) { sources[r.source] = true; });
  Object.keys(SOURCE_MARKS).forEach(function (s) {
    if (sources[s]) document.getElementById("modules-table").appendChild(el("p", { cls: "note", text: SOURCE_MARKS[s].join(" ") }));
  });
  // The work columns get a table of their own, same rows in the same order: beside the
  // eight time columns they would not fit a laptop's window.
  if (modWork.length) {
    var workBox = document.getElementById("modules-work");
    workBox.appendChild(el("h3", { text: "Work per step of the same modules (counted steps)" }));
    workBox.appendChild(table([
      { key: "fqn", label: "module", name: true },
      { key: "phase", label: "phase" },
    ].concat(modWork), mods));
  }
  var modRows = document.querySelectorAll("#modules-table tbody tr");
  mods.forEach(function (r, i) {
    var cell = modRows[i].children[0].firstChild;
    var bar = el("span", { cls: "bar", style: "width:" + Math.max(2, Math.round(60 * (r.self_total_ns || 0) / maxSelf)) + "px;background:" + (COLORS[r.phase] || "#888") });
    cell.insertBefore(bar, cell.firstChild);
  });
  if (!mods.length) document.getElementById("modules-table").appendChild(el("p", { cls: "note", text: "no closed spans" }));

  // -- stragglers (a multi-rank run: modtrace stragglers) ----------------------------

  if (DATA.stragglers) {
    var st = DATA.stragglers;
    var stBox = document.getElementById("stragglers");
    document.getElementById("stragglers-section").hidden = false;
    function who(s) {
      if (!s) return "";
      return s.kind === "rank" ? "rank " + s.rank + " (every module, " + s.ratio.toFixed(2) + "x)"
        : "rank " + s.rank + " " + s.fqn + " " + s.phase;
    }
    stBox.appendChild(el("p", { cls: "note", text: "The other sections show rank " + DATA.rank + " of " + st.ranks +
      " (--rank picks another). Per step, the rank and module that held the step back beyond the ranks' noise, where the others waited, and the step without it (docs/ranks.md, Stragglers)." }));
    st.persistent.forEach(function (p) {
      stBox.appendChild(el("p", { text: "Persistent straggler: " + who(p) + ", " + p.steps + " of " +
        st.steps.length + " steps, median +" + fmtNs(p.median_excess_ns) + "; what-if step " + fmtNs(p.what_if_step_ns) }));
    });
    if (!st.persistent.length) stBox.appendChild(el("p", { cls: "ok", text: "No persistent straggler: no rank and module held back half the steps or more." }));
    if (st.left_out_steps.length) stBox.appendChild(el("p", { cls: "note", text: "Left out (not every rank recorded them): steps " + st.left_out_steps.join(", ") }));
    stBox.appendChild(scroll(table([
      { key: "step", label: "step", num: true },
      { key: "step_ns", label: "step", num: true, fmt: function (v) { return fmtNs(v); } },
      { key: "straggler", label: "straggler", get: function (r) { return who(r.straggler); } },
      { key: "excess", label: "excess", num: true, get: function (r) { return r.straggler ? r.straggler.excess_ns : null; },
        fmt: function (v) { return v === null ? "" : "+" + fmtNs(v); } },
      { key: "waited", label: "others waited", get: function (r) {
        if (!r.waited) return "";
        var parts = [];
        if (r.waited.outside_ns) parts.push("outside modules " + fmtNs(r.waited.outside_ns));
        if (r.waited.inside) parts.push("in " + r.waited.inside.fqn + " " + r.waited.inside.phase + " " + fmtNs(r.waited.inside.ns));
        return parts.join("; ");
      } },
      { key: "what_if_step_ns", label: "what-if step", num: true, fmt: function (v) { return fmtNs(v); } },
    ], st.steps)));
  }

  // -- nesting issues -----------------------------------------------------------

  var issuesBox = document.getElementById("issues");
  var iss = DATA.issues;
  if (!iss.total) {
    issuesBox.appendChild(el("p", { cls: "ok", text: "No nesting issues: every enter has its exit, properly nested." }));
  } else {
    issuesBox.appendChild(table([
      { key: "severity", label: "severity", cls: function (v) { return "sev-" + v; } },
      { key: "kind", label: "kind" },
      { key: "n", label: "count", num: true, fmt: function (v) { return fmtNum(v); } },
    ], iss.counts));
    if (!sev.error && !sev.warning) {
      issuesBox.appendChild(el("p", { cls: "ok", text: "No errors or warnings; the info rows are normal (checkpoint early stops, backward closed at the end of the pass)." }));
    }
    var cols = (multiRank ? [{ key: "rank", label: "rank", num: true }] : []).concat([
      { key: "seq", label: "seq", num: true },
      { key: "severity", label: "severity", cls: function (v) { return "sev-" + v; } },
      { key: "kind", label: "kind" },
      { key: "step", label: "step", num: true },
      { key: "message", label: "message", breaks: /[.]/ },
    ]);
    issuesBox.appendChild(scroll(table(cols, iss.rows)));
    if (iss.rows.length < iss.total) {
      issuesBox.appendChild(el("p", { cls: "note", text: "showing " + iss.rows.length + " of " + fmtNum(iss.total) + " issues; `modtrace check` lists them all" }));
    }
  }

  // -- trend charts: each blamed module's self time per step across the runs -------------

  // SVG as markup, parsed by the page's HTML parser (which puts <svg> in the SVG namespace
  // itself, so the file names no namespace URL); every value is escaped.
  function esc(v) {
    return String(v).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  }

  function svgEl(tag, attrs, inner) {
    var a = Object.keys(attrs || {}).map(function (k) { return " " + k + '="' + esc(attrs[k]) + '"'; }).join("");
    return "<" + tag + a + ">" + (inner || "") + "</" + tag + ">";
  }

  // One small inline SVG per blamed module: a point per run (the baseline's runs, oldest first,
  // then the candidate), so one base run draws two points and a history of N runs N + 1.
  function drawTrends(trend, box) {
    box.appendChild(el("h3", { text: "What was blamed, across the runs" }));
    box.appendChild(el("p", { cls: "note", text: "Self time per step (median over the compared steps; for a step-wide " +
      "regression, the step time) in each baseline run, oldest first, then the candidate (red); hover a point for its " +
      "run and value." }));
    var grid = el("div", { cls: "trends" });
    var W = 240, H = 96, L = 8, R = 8, T = 18, B = 20;
    trend.series.forEach(function (s) {
      var vals = s.self_us.filter(function (v) { return v !== null; });
      var lo = Math.min.apply(null, vals.concat([0])), hi = Math.max.apply(null, vals);
      if (!(hi > lo)) hi = lo + 1;
      var n = s.self_us.length;
      var x = function (i) { return n === 1 ? W / 2 : L + (W - L - R) * i / (n - 1); };
      var y = function (v) { return T + (H - T - B) * (1 - (v - lo) / (hi - lo)); };
      var parts = [svgEl("title", {}, esc(s.fqn + " (" + s.phase + ")")),
        svgEl("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, "class": "axis" })];
      var pts = [];
      s.self_us.forEach(function (v, i) { if (v !== null) pts.push(x(i).toFixed(1) + "," + y(v).toFixed(1)); });
      parts.push(svgEl("polyline", { points: pts.join(" "), "class": "trend-line" }));
      s.self_us.forEach(function (v, i) {
        if (v === null) return;
        var run = trend.runs[i];
        parts.push(svgEl("circle", { cx: x(i).toFixed(1), cy: y(v).toFixed(1), r: 3.5, "class": "trend-" + run.role,
          "data-run": run.run, "data-us": v },
          svgEl("title", {}, esc(run.run + " (" + (run.role === "cand" ? "candidate" : "base") + "): " +
            fmtUs(v).replace(NB, " ") + " per step"))));
      });
      var first = s.self_us[0], last = s.self_us[n - 1];
      if (n > 1 && first !== null) parts.push(svgEl("text", { x: L, y: 12, "class": "trend-label" }, esc(fmtUs(first).replace(NB, " "))));
      if (last !== null) parts.push(svgEl("text", { x: W - R, y: 12, "text-anchor": "end", "class": "trend-value" }, esc(fmtUs(last).replace(NB, " "))));
      var clip = function (t) { t = String(t); return t.length > 16 ? t.slice(0, 15) + "\u2026" : t; };
      parts.push(svgEl("text", { x: L, y: H - 6, "class": "trend-label" }, esc(clip(trend.runs[0].run))));
      parts.push(svgEl("text", { x: W - R, y: H - 6, "text-anchor": "end", "class": "trend-label" }, esc(clip(trend.runs[n - 1].run))));
      var figure = el("figure", { cls: "trend-figure", title: s.fqn });
      figure.innerHTML = svgEl("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img", "class": "trend",
        "data-fqn": s.fqn, "data-phase": s.phase,
        "aria-label": s.fqn + " " + s.phase + ": self time per step across " + n + " runs" }, parts.join(""));
      figure.appendChild(el("figcaption", null, [breakable(shortName(s.fqn) + " " + s.phase, /[.\/,]/)]));
      grid.appendChild(figure);
    });
    box.appendChild(grid);
  }

  // -- diff --------------------------------------------------------------------

  if (DATA.diff) {
    // The document `modtrace diff BASE RUN --format json` prints, drawn as its table renderer draws
    // it (renderers/diff.py): the same headline, sections, headers and numbers.
    var d = DATA.diff;
    document.getElementById("diff-section").hidden = false;
    document.getElementById("diff-base").textContent = d.base.run + " (base)";
    var sm = d.summary;
    var headlineBox = document.getElementById("diff-summary");
    var lines = el("ul", { cls: "headline" });
    (DATA.diff_headline || []).forEach(function (line) { lines.appendChild(el("li", null, [breakable(line, /[.\/,]/)])); });
    headlineBox.appendChild(lines);
    headlineBox.appendChild(el("p", null, [
      el("span", { cls: sm.regressions ? "sev-error" : "ok", text: fmtNum(sm.regressions) + " regressions" }),
      ", " + fmtNum(sm.improvements) + " improvements, " + fmtNum(sm.structure_changes) + " structure changes; " +
      "the same as `modtrace diff " + d.base.run + " " + d.cand.run + "`.",
    ]));
    if (DATA.trend) drawTrends(DATA.trend, document.getElementById("diff-trend"));
    if (d.structure.length) {
      document.getElementById("diff-structure").appendChild(el("h3", { text: "Structure" }));
      document.getElementById("diff-structure").appendChild(scroll(table([
        { key: "kind", label: "change" },
        { key: "fqn", label: "module", name: true },
        { key: "phase", label: "phase" },
        { key: "message", label: "detail", breaks: /[.]/ },
      ], d.structure)));
    }
    if (d.order) {
      var box = document.getElementById("diff-divergence");
      var o = d.order;
      box.appendChild(el("h3", { text: "Call order differs: step " + o.step_base +
        (o.step_cand === o.step_base ? "" : " (candidate step " + o.step_cand + ")") + ", first at call " + o.position }));
      var ex = o.excerpt.map(function (r) {
        if (r.op === "+") return "+ " + r.cand;
        if (r.op === "~") return "~ " + r.base + "   \u2192   " + String(r.cand).trim();
        return r.op + " " + (r.base === null ? "" : r.base);
      }).join("\n");
      box.appendChild(el("p", { cls: "note", text: "= same in both runs, - base only, + candidate only, ~ differs (base \u2192 candidate)" }));
      box.appendChild(el("pre", { cls: "excerpt", text: ex }));
    }
    var timingBox = document.getElementById("diff-timing");
    // renderers/diff.py SECTIONS and TIMING_HEADERS; the inherited rows show inclusive time.
    var sections = [
      ["regression", "self", "Regressions (self time got slower; sorted by impact on step time)"],
      ["improvement", "self", "Improvements (self time got faster)"],
      ["inherited", "incl", "Inherited (inclusive time changed through a descendant: context, not blame)"],
      ["unchanged", "self", "Unchanged"],
    ];
    var of = function (metric) {
      return function (r) { return metric === "self" ? r.self : r.inclusive; };
    };
    sections.forEach(function (sec) {
      var rows = d.timing.filter(function (r) { return r.verdict === sec[0]; });
      if (!rows.length) return;
      var metric = sec[1], st = of(metric), what = metric === "self" ? "self" : "inclusive";
      timingBox.appendChild(el("h3", { text: sec[2] }));
      timingBox.appendChild(scroll(table([
        { key: "fqn", label: "module", name: true },
        { key: "phase", label: "phase" },
        { label: "base", num: true, get: function (r) { return st(r).base_us; }, fmt: function (v) { return fmtUs(v); },
          title: "base: the base run's median " + what + " time per step (" + (metric === "self" ? "self/step" : "incl/step") + " over the compared steps)" },
        { label: "cand", num: true, get: function (r) { return st(r).cand_us; }, fmt: function (v) { return fmtUs(v); },
          title: "cand: the candidate's median " + what + " time per step" },
        { label: "delta", num: true, get: function (r) { return st(r).delta_us; }, fmt: function (v) { return fmtUs(v, true); },
          title: "delta: cand - base" },
        { label: "change", num: true, get: function (r) { return st(r).ratio; }, fmt: fmtRatio,
          title: "change: cand / base - 1" },
        { label: "CI of delta", num: true, cls: "wrap", get: function (r) { return st(r); },
          fmt: function (v) { return v.ci_low_us === null || v.ci_high_us === null ? "" : "[" + fmtUs(v.ci_low_us, true) + ", " + fmtUs(v.ci_high_us, true) + "]"; },
          title: "CI of delta: confidence interval of delta at 1 - alpha" },
        { label: "p (Holm)", num: true, get: function (r) { return st(r).p_adjusted; }, fmt: fmtP, title: GLOSSARY.pHolm },
        { label: "share of step", num: true, cls: "wrap", get: function (r) { return metric === "self" ? r.self_share : r.inclusive_share; },
          fmt: function (v) { return v.base_pct === null || v.cand_pct === null ? "" : fmtG(v.base_pct, 3) + "% \u2192" + NB + fmtG(v.cand_pct, 3) + "%"; },
          title: "share of step: median share of the step time, base \u2192 cand" },
        { label: "impact/step", num: true, cls: "wrap", get: function (r) { return r; },
          fmt: function (r) {
            var impact = metric === "self" ? r.impact_us : st(r).delta_us;
            var pct = r.impact_pct;
            return fmtUs(impact, true) + (pct === null || metric !== "self" ? "" : " (" + (pct >= 0 ? "+" : "") + pct.toFixed(1) + "%)");
          },
          title: "impact/step: change of the median " + what + " time per step" + (metric === "self" ? " (and as a percentage of the base step time)" : "") },
      ], rows, function () { return sec[0]; })));
    });
    if (d.timing.length < sm.compared) {
      timingBox.appendChild(el("p", { cls: "note", text: "showing " + d.timing.length + " of " + fmtNum(sm.compared) + " rows (all changed ones first); `modtrace diff --all` lists them all" }));
    }
  }

  // -- run metadata ---------------------------------------------------------------

  var runRows = Object.keys(run).filter(function (k) { return run[k] !== null && run[k] !== undefined; }).map(function (k) {
    var v = run[k];
    return { field: k, value: typeof v === "object" ? JSON.stringify(v) : String(v) };
  });
  document.getElementById("run-table").appendChild(table([
    { key: "field", label: "field" }, { key: "value", label: "value", cls: "code", breaks: /[.\/,:=]/ },
  ], runRows));
  document.getElementById("footer").textContent =
    "Generated by modtrace " + DATA.modtrace_version + ". Self-contained: this file loads nothing from the network.";

  // -- start -------------------------------------------------------------------------

  var initial = 0;
  flame.steps.forEach(function (s, i) { if (s.step === DATA.default_step) initial = i; });
  showStep(initial);
  var resizeTimer = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () { drawFlame(); drawStepsChart(); }, 100);
  });
  document.body.setAttribute("data-rendered", "true");
})();
