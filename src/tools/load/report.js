// agent-gateway load: draws the HTML report from the JSON the page carries (inlined into the
// page; no library, no network). Charts are inline SVG. Each chart's <svg> gets
// data-plot-box="x,y,w,h" (its plot area in page pixels) and each drawn series data-points,
// so a test can check in a headless browser that every chart was drawn.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var root = document.getElementById("report");
  var SVGNS = "http://www.w3.org/2000/svg";

  // --- building blocks ----------------------------------------------------------------------
  function el(tag, attrs, children) {
    var e = document.createElement(tag);
    setAttrs(e, attrs);
    append(e, children);
    return e;
  }
  function sv(tag, attrs, children) {
    var e = document.createElementNS(SVGNS, tag);
    setAttrs(e, attrs);
    append(e, children);
    return e;
  }
  function setAttrs(e, attrs) {
    for (var k in attrs || {}) {
      if (attrs[k] !== undefined && attrs[k] !== null) e.setAttribute(k, attrs[k]);
    }
  }
  function append(e, children) {
    (Array.isArray(children) ? children : children === undefined ? [] : [children]).forEach(
      function (c) {
        if (c === null || c === undefined) return;
        e.appendChild(typeof c === "string" || typeof c === "number"
          ? document.createTextNode(String(c)) : c);
      });
  }
  function sig(v, digits) {
    if (v === null || v === undefined || !isFinite(v)) return "-";
    if (v === 0) return "0";
    var p = Math.max(0, digits - 1 - Math.floor(Math.log10(Math.abs(v))));
    return v.toFixed(Math.min(p, 6));
  }
  function ms(v) { return v === null || v === undefined ? "-" : sig(v, 3) + " ms"; }
  function rate(v) {
    if (v === null || v === undefined) return "-";
    return (v >= 100 ? Math.round(v) : Math.round(v * 10) / 10).toLocaleString("en-US") + " req/s";
  }
  function pct(v) { return v === null || v === undefined ? "-" : sig(v * 100, 3) + "%"; }
  function showVerdictValue(v) {
    if (v.actual === null) return "nothing measured";
    if (v.unit === "ms") return ms(v.actual);
    if (v.unit === "ratio") return pct(v.actual);
    return rate(v.actual);
  }
  function table(head, rows) {
    return el("table", {}, [
      el("thead", {}, el("tr", {}, head.map(function (h) { return el("th", {}, h); }))),
      el("tbody", {}, rows.map(function (r) {
        return el("tr", {}, r.map(function (c) {
          return c instanceof Node ? el("td", {}, c) : el("td", typeof c === "number" ? { class: "num" } : {}, String(c));
        }));
      })),
    ]);
  }
  function card(k, v) { return el("div", { class: "card" }, [el("div", { class: "k" }, k), el("div", { class: "v" }, v)]); }

  // --- scales -------------------------------------------------------------------------------
  function niceStep(span, target) {
    var raw = span / Math.max(1, target);
    var mag = Math.pow(10, Math.floor(Math.log10(raw)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i++) if (steps[i] * mag >= raw) return steps[i] * mag;
    return 10 * mag;
  }
  function linear(lo, hi, a, b) {
    if (hi <= lo) hi = lo + 1;
    var f = function (v) { return a + (v - lo) * (b - a) / (hi - lo); };
    f.ticks = function (n) {
      var step = niceStep(hi - lo, n), out = [];
      for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toFixed(10));
      return out;
    };
    f.label = function (v) { return v.toLocaleString("en-US"); };
    return f;
  }
  function logScale(lo, hi, a, b) {
    lo = Math.max(lo, 1e-6);
    if (hi <= lo) hi = lo * 10;
    var l0 = Math.log10(lo), l1 = Math.log10(hi);
    var f = function (v) { return a + (Math.log10(Math.max(v, lo)) - l0) * (b - a) / (l1 - l0); };
    f.ticks = function () {
      var out = [];
      var each = l1 - l0 > 3 ? [1] : l1 - l0 > 1.5 ? [1, 2, 5] : [1, 1.5, 2, 3, 5, 7];
      for (var e = Math.floor(l0); e <= Math.ceil(l1); e++) {
        each.forEach(function (m) {
          var v = m * Math.pow(10, e);
          if (v >= lo * 0.999 && v <= hi * 1.001) out.push(v);
        });
      }
      return out;
    };
    f.label = function (v) { return sig(v, 2); };
    return f;
  }
  // HdrHistogram's percentile axis: x = log10(1 / (1 - q)), so 90%, 99%, 99.9% are evenly spaced.
  function hdrX(q, cap) { return Math.min(Math.log10(1 / Math.max(1 - q, 1e-12)), cap); }

  // --- the chart ----------------------------------------------------------------------------
  var W = 1040, H = 300, M = { l: 56, r: 16, t: 12, b: 36 };
  // spec: { id, title, note, x: {lo, hi, ticks?, label?, title}, y: {log, lo, hi, title, fmt},
  //         lines: [{name, color, points: [[x, y|null]], dash, dots, dotColors}],
  //         bars: [{name, color, values: [[x0, x1, [y0, y1]]]}], markers: [{x, label}],
  //         hlines: [{y, label, color}] }
  function chart(spec) {
    var pw = W - M.l - M.r, ph = H - M.t - M.b;
    var xs = linear(spec.x.lo, spec.x.hi, M.l, M.l + pw);
    if (spec.x.ticks) { xs.ticks = function () { return spec.x.ticks; }; }
    if (spec.x.label) xs.label = spec.x.label;
    var ys = spec.y.log ? logScale(spec.y.lo, spec.y.hi, M.t + ph, M.t)
      : linear(spec.y.lo, spec.y.hi, M.t + ph, M.t);
    var svg = sv("svg", { class: "chart", id: spec.id, viewBox: "0 0 " + W + " " + H,
      width: W, height: H, role: "img", "aria-label": spec.title });
    var g = sv("g");
    svg.appendChild(g);
    ys.ticks(6).forEach(function (v) {
      var y = ys(v);
      g.appendChild(sv("line", { class: "grid", x1: M.l, x2: M.l + pw, y1: y, y2: y }));
      g.appendChild(sv("text", { x: M.l - 6, y: y + 4, "text-anchor": "end" }, ys.label(v)));
    });
    xs.ticks(10).forEach(function (v) {
      var x = xs(v);
      g.appendChild(sv("line", { class: "grid", x1: x, x2: x, y1: M.t, y2: M.t + ph }));
      // A label at the right edge ends there rather than running off the chart.
      g.appendChild(sv("text", { x: x, y: M.t + ph + 15,
        "text-anchor": x > M.l + pw - 24 ? "end" : "middle" }, xs.label(v)));
    });
    g.appendChild(sv("line", { class: "axis", x1: M.l, x2: M.l + pw, y1: M.t + ph, y2: M.t + ph }));
    g.appendChild(sv("line", { class: "axis", x1: M.l, x2: M.l, y1: M.t, y2: M.t + ph }));
    g.appendChild(sv("text", { x: M.l + pw / 2, y: H - 4, "text-anchor": "middle" }, spec.x.title));
    g.appendChild(sv("text", { x: 12, y: M.t + ph / 2, "text-anchor": "middle",
      transform: "rotate(-90 12 " + (M.t + ph / 2) + ")" }, spec.y.title));
    // The plot area, what the series are clipped to and what a test looks into.
    var clipId = spec.id + "-clip";
    svg.appendChild(sv("clipPath", { id: clipId }, sv("rect", { x: M.l, y: M.t, width: pw, height: ph })));
    var plot = sv("g", { "clip-path": "url(#" + clipId + ")", class: "plot" });
    var area = sv("rect", { class: "plot-area", x: M.l, y: M.t, width: pw, height: ph, fill: "none" });
    svg.appendChild(area);
    svg.appendChild(plot);
    (spec.markers || []).forEach(function (m) {
      var x = xs(m.x);
      plot.appendChild(sv("line", { class: "marker", x1: x, x2: x, y1: M.t, y2: M.t + ph }));
      svg.appendChild(sv("text", { x: x + 3, y: M.t + 10, class: "marker-label" }, m.label));
    });
    (spec.bars || []).forEach(function (b) {
      var gb = sv("g", { class: "series bars", "data-series": b.name, fill: b.color,
        "data-points": b.values.length });
      b.values.forEach(function (v) {
        var x0 = xs(v[0]), x1 = xs(v[1]), y0 = ys(v[2][0]), y1 = ys(v[2][1]);
        gb.appendChild(sv("rect", { x: x0, y: Math.min(y0, y1), width: Math.max(x1 - x0, 1),
          height: Math.max(Math.abs(y0 - y1), 0.5) }));
      });
      plot.appendChild(gb);
    });
    (spec.hlines || []).forEach(function (h) {
      var y = ys(h.y);
      plot.appendChild(sv("line", { x1: M.l, x2: M.l + pw, y1: y, y2: y, stroke: h.color,
        "stroke-width": 1.5, "stroke-dasharray": "6 4" }));
      svg.appendChild(sv("text", { x: M.l + pw - 4, y: y - 4, "text-anchor": "end", fill: h.color }, h.label));
    });
    (spec.lines || []).forEach(function (s) {
      var d = "", pen = false, n = 0;
      s.points.forEach(function (p) {
        if (p[1] === null || p[1] === undefined || !isFinite(p[1]) || (spec.y.log && p[1] <= 0)) {
          pen = false;
          return;
        }
        d += (pen ? "L" : "M") + xs(p[0]).toFixed(1) + "," + ys(p[1]).toFixed(1);
        pen = true;
        n++;
      });
      var path = sv("path", { class: "series line", "data-series": s.name, "data-points": n, d: d,
        fill: "none", stroke: s.color, "stroke-width": s.width || 2,
        "stroke-dasharray": s.dash ? "7 5" : null, "stroke-linejoin": "round" });
      plot.appendChild(path);
      if (s.dots) {
        s.points.forEach(function (p, i) {
          if (p[1] === null || (spec.y.log && p[1] <= 0)) return;
          plot.appendChild(sv("circle", { cx: xs(p[0]), cy: ys(p[1]), r: 5,
            fill: (s.dotColors && s.dotColors[i]) || s.color, stroke: "#fff", "stroke-width": 1.5 }));
        });
      }
    });
    var legend = el("div", { class: "legend" }, (spec.lines || []).concat(spec.bars || []).map(function (s) {
      return el("span", {}, [el("i", { style: "background:" + s.color }), s.name]);
    }));
    var fig = el("figure", { "data-chart": spec.id }, [
      el("figcaption", {}, spec.title),
      spec.note ? el("div", { class: "note" }, spec.note) : null,
      svg, legend]);
    charts.push({ svg: svg, area: area });
    return fig;
  }
  var charts = [];

  // --- the data -----------------------------------------------------------------------------
  var knee = data.mode === "find_max";
  var runs = knee
    ? data.steps.map(function (s, i) { return { label: "step " + (i + 1) + " (" + s.rate + " req/s)", report: s.report, held: s.held, rate: s.rate }; })
    : [{ label: "run", report: data }];
  // One time axis over every run (the steps of a knee search follow one another).
  var seconds = [], markers = [], offset = 0;
  runs.forEach(function (run, k) {
    if (knee) markers.push({ x: offset, label: "step " + (k + 1) });
    var stages = run.report.stages;
    if (stages) {
      var t = 0;
      stages.forEach(function (s, i) {
        if (i > 0) markers.push({ x: offset + t, label: "stage " + (i + 1) });
        t += s.duration_s;
      });
    }
    // An entry covers span_s seconds (more than 1 in a run too long to keep each); its counts
    // are drawn per second, at its middle. Older reports have no span_s: 1.
    var tl = run.report.timeline, end = 0;
    tl.forEach(function (s) {
      var w = s.span_s || 1;
      seconds.push({ x: offset + s.t, w: w, s: s, run: run });
      end = s.t + w;
    });
    offset += Math.max(end, Math.ceil(run.report.elapsed_s));
  });
  var span = Math.max(offset, 1);
  var xTime = { lo: 0, hi: span, title: "seconds since the start" };

  // --- the page -----------------------------------------------------------------------------
  var first = runs.length ? runs[0].report : null;
  var title, badge = null;
  if (knee) {
    title = "Finding the highest rate that holds " + data.slo.join(" and ");
    badge = data.max_rate_held !== null ? el("span", { class: "badge pass" }, "FOUND")
      : el("span", { class: "badge fail" }, "NONE HELD");
  } else {
    title = "Load test of " + data.target;
    if (data.thresholds.length) {
      var ok = data.thresholds.every(function (v) { return v.passed; });
      badge = el("span", { class: "badge " + (ok ? "pass" : "fail") }, ok ? "PASS" : "FAIL");
    }
  }
  var interrupted = data.interrupted;
  root.appendChild(el("h1", {}, [title, badge,
    interrupted ? el("span", { class: "badge interrupted" }, "INTERRUPTED") : null]));
  var model = !first ? "" : first.model === "closed" ? "closed model (--rate max)"
    : knee ? "open model, flat steps of " + data.step_duration_s + " s"
    : first.rate !== null ? "open model at " + rate(first.rate)
    : "open model, ramps " + first.stages.map(function (s) { return s.duration_s + "s:" + s.target_rps; }).join(",");
  var connections = data.connections + " connections" +
    (first && first.http === "2" ? " × " + first.streams + " streams (HTTP/2)" : "");
  root.appendChild(el("p", { class: "sub" }, [(knee ? data.target + " · " : "") + "api " + data.api + " · " + model +
    " · " + connections + " · started " + data.started_at]));

  if (knee) {
    root.appendChild(el("div", { class: "cards" }, [
      card("highest rate held", data.max_rate_held === null ? "none" : rate(data.max_rate_held)),
      card("lowest rate broken", data.lowest_rate_broken === null ? "none" : rate(data.lowest_rate_broken)),
      card("steps", String(data.steps.length)),
      card("SLO", data.slo.join(", ")),
    ]));
  } else {
    var r = data, l = r.latency_ms, okResp = r.responses > 0;
    root.appendChild(el("div", { class: "cards" }, [
      card("throughput", rate(r.throughput_rps)),
      card("responses", r.responses.toLocaleString("en-US")),
      card("p50", okResp ? ms(l.p50) : "-"), card("p99", okResp ? ms(l.p99) : "-"),
      card("p99.9", okResp ? ms(l.p99_9) : "-"), card("max", okResp ? ms(l.max) : "-"),
      card("errors", r.errors.total.toLocaleString("en-US")),
      card("elapsed", sig(r.elapsed_s, 3) + " s"),
    ]));
    if (r.thresholds.length) {
      root.appendChild(el("h2", {}, "Thresholds"));
      root.appendChild(table(["threshold", "measured", "verdict"], r.thresholds.map(function (v) {
        return [el("code", {}, v.threshold), showVerdictValue(v),
          el("span", { class: v.passed ? "ok" : "bad" }, v.passed ? "pass" : "FAIL")];
      })));
    }
  }

  if (knee && runs.length) {
    root.appendChild(el("h2", {}, "Steps"));
    root.appendChild(table(["step", "rate", "achieved", "p50", "p99", "errors", "SLO"], runs.map(function (run, i) {
      var rr = run.report;
      var verdict = run.held === null ? el("span", { class: "muted" }, "interrupted")
        : el("span", { class: run.held ? "ok" : "bad" }, run.held ? "held"
          : "broke: " + rr.thresholds.filter(function (v) { return !v.passed; }).map(function (v) { return v.threshold + " (" + showVerdictValue(v) + ")"; }).join(", "));
      return [i + 1, run.rate, rate(rr.throughput_rps), ms(rr.latency_ms.p50), ms(rr.latency_ms.p99), rr.errors.total, verdict];
    })));
    if (data.failed_step) {
      root.appendChild(el("p", { class: "bad" }, "Step " + (runs.length + 1) + " at " + rate(data.failed_step.rate) +
        " broke: " + data.failed_step.error + " (the search ended there)."));
    }
    var judged = runs.filter(function (r) { return r.held !== null; }).slice().sort(function (a, b) { return a.rate - b.rate; });
    var latVals = [];
    judged.forEach(function (r) { if (r.report.responses) latVals.push(r.report.latency_ms.p50, r.report.latency_ms.p99); });
    var hl = [];
    data.steps.length && data.steps[0].report.thresholds.forEach(function (v) {
      if (v.unit === "ms") { hl.push({ y: v.limit, label: v.threshold, color: "#c62828" }); latVals.push(v.limit); }
    });
    var maxRate = Math.max.apply(null, judged.map(function (r) { return r.rate; }).concat([1]));
    root.appendChild(chart({
      id: "knee", title: "Latency by step rate",
      note: "Each judged step at its target rate; green held the SLO, red broke it.",
      x: { lo: 0, hi: maxRate * 1.05, title: "target rate (req/s)" },
      y: { log: true, lo: Math.min.apply(null, latVals.concat([1])) / 1.5, hi: Math.max.apply(null, latVals.concat([0.001])) * 1.5, title: "latency (ms)" },
      lines: [
        { name: "p50", color: "#1f77b4", points: judged.map(function (r) { return [r.rate, r.report.responses ? r.report.latency_ms.p50 : null]; }) },
        { name: "p99", color: "#d62728", dots: true, points: judged.map(function (r) { return [r.rate, r.report.responses ? r.report.latency_ms.p99 : null]; }),
          dotColors: judged.map(function (r) { return r.held ? "#1a7f37" : "#c62828"; }) },
      ],
      hlines: hl,
    }));
  }

  // Throughput over time.
  var peakTarget = 0, peakDone = 0;
  seconds.forEach(function (p) {
    peakTarget = Math.max(peakTarget, p.s.target_rps || 0);
    peakDone = Math.max(peakDone, p.s.responses / p.w);
  });
  // The target first, so the measured line is drawn over it.
  var tLines = [];
  if (seconds.some(function (p) { return p.s.target_rps !== null; })) {
    tLines.push({ name: "target (the schedule)", color: "#ff7f0e", dash: true, width: 4,
      points: seconds.map(function (p) { return [p.x + p.w / 2, p.s.target_rps]; }) });
  }
  tLines.push({ name: "responses per second", color: "#1f77b4",
    points: seconds.map(function (p) { return [p.x + p.w / 2, p.s.responses / p.w]; }) });
  root.appendChild(el("h2", {}, "Over time"));
  root.appendChild(chart({
    id: "throughput", title: "Throughput", x: xTime,
    note: "Answers completed in each second" + (tLines.length > 1 ? ", against the requests the schedule called for in it." : "."),
    y: { lo: 0, hi: Math.max(peakTarget, peakDone, 1) * 1.1, title: "req/s" },
    lines: tLines, markers: markers,
  }));

  // Latency percentiles over time.
  var pcts = [["p50", "p50", "#1f77b4"], ["p90", "p90", "#17becf"], ["p99", "p99", "#d62728"],
    ["p99.9", "p99_9", "#9467bd"], ["max", "max", "#8c564b"]];
  var lo = Infinity, hi = 0;
  seconds.forEach(function (p) {
    if (!p.s.latency_ms) return;
    lo = Math.min(lo, p.s.latency_ms.p50);
    hi = Math.max(hi, p.s.latency_ms.max);
  });
  if (!isFinite(lo)) { lo = 0.1; hi = 1; }
  root.appendChild(chart({
    id: "latency", title: "Latency percentiles per second", x: xTime,
    note: "Of the answers completed in each second, measured from " + (first ? first.latency_from : "the send") + "; log scale.",
    y: { log: true, lo: lo / 1.5, hi: hi * 1.5, title: "latency (ms)" },
    lines: pcts.map(function (q) {
      return { name: q[0], color: q[2], width: q[0] === "p50" || q[0] === "p99" ? 2 : 1.5,
        points: seconds.map(function (p) { return [p.x + p.w / 2, p.s.latency_ms ? p.s.latency_ms[q[1]] : null]; }) };
    }),
    markers: markers,
  }));

  // Statuses and errors over time, stacked.
  var classes = {};
  seconds.forEach(function (p) {
    Object.keys(p.s.statuses).forEach(function (k) { classes["HTTP " + k] = { status: +k }; });
    Object.keys(p.s.errors).forEach(function (k) { classes[k] = { error: k }; });
  });
  var palettes = { ok: ["#2ca02c", "#98df8a", "#4d9221"], client: ["#ff7f0e", "#ffbb78", "#e6550d", "#fdae6b", "#a63603"],
    server: ["#d62728", "#ff9896", "#a50f15", "#fb6a4a"], other: ["#bcbd22", "#dbdb8d"],
    error: ["#6a3d9a", "#cab2d6", "#e377c2", "#f7b6d2", "#393b79", "#7b4173"] };
  var used = { ok: 0, client: 0, server: 0, other: 0, error: 0 };
  var keys = Object.keys(classes).sort(function (a, b) {
    var ca = classes[a], cb = classes[b];
    if (ca.status !== undefined && cb.status !== undefined) return ca.status - cb.status;
    return ca.status !== undefined ? -1 : cb.status !== undefined ? 1 : a < b ? -1 : 1;
  });
  var stack = seconds.map(function () { return 0; });
  var peakStack = 1;
  var bars = keys.map(function (k) {
    var c = classes[k];
    var family = c.error ? "error" : c.status < 300 && c.status >= 200 ? "ok" : c.status >= 500 ? "server" : c.status >= 400 ? "client" : "other";
    var color = palettes[family][used[family]++ % palettes[family].length];
    var values = [];
    seconds.forEach(function (p, i) {
      var n = (c.error ? p.s.errors[c.error] || 0 : p.s.statuses[String(c.status)] || 0) / p.w;
      if (!n) return;
      values.push([p.x + 0.08 * p.w, p.x + 0.92 * p.w, [stack[i], stack[i] + n]]);
      stack[i] += n;
      peakStack = Math.max(peakStack, stack[i]);
    });
    return { name: c.error ? "no answer: " + c.error : k, color: color, values: values };
  });
  root.appendChild(chart({
    id: "statuses", title: "Statuses and errors per second", x: xTime,
    note: "Answers by status, and requests that got none (connect, timeout, closed, io, protocol, unsent), stacked.",
    y: { lo: 0, hi: peakStack * 1.1, title: "per second" },
    bars: bars, markers: markers,
  }));

  // The latency distribution, HdrHistogram style.
  root.appendChild(el("h2", {}, "Latency distribution"));
  var cap = 0, dlo = Infinity, dhi = 0;
  runs.forEach(function (run) {
    var n = run.report.responses;
    if (n > 0) cap = Math.max(cap, Math.log10(n));
    run.report.latency_distribution.forEach(function (d) { dlo = Math.min(dlo, d.latency_ms); dhi = Math.max(dhi, d.latency_ms); });
  });
  cap = Math.max(cap, 2);
  if (!isFinite(dlo)) { dlo = 0.1; dhi = 1; }
  var dTicks = [], dNames = {};
  for (var e = 0; e <= Math.floor(cap); e++) {
    dTicks.push(e);
    dNames[e] = e === 0 ? "0%" : (100 - Math.pow(10, 2 - e)).toFixed(Math.max(0, e - 2)) + "%";
  }
  root.appendChild(chart({
    id: "distribution", title: "Latency by percentile (HDR)",
    note: "The share of answers at or below each latency; percentiles on a log scale (90%, 99%, 99.9% evenly spaced), latency on a log scale." + (knee ? " One line per step." : ""),
    x: { lo: 0, hi: cap, ticks: dTicks, label: function (v) { return dNames[v]; }, title: "percentile" },
    y: { log: true, lo: dlo / 1.5, hi: dhi * 1.5, title: "latency (ms)" },
    lines: runs.filter(function (run) { return run.report.latency_distribution.length; }).map(function (run, i, all) {
      var color = all.length === 1 ? "#1f77b4" : "hsl(" + Math.round(220 - 200 * i / Math.max(1, all.length - 1)) + ",70%,45%)";
      var n = run.report.responses;
      return { name: knee ? run.label : "latency", color: color,
        points: run.report.latency_distribution.map(function (d) {
          return [hdrX(d.percentile / 100, Math.log10(n)), d.latency_ms];
        }) };
    }),
  }));

  // Latency by operation (a run's page): the table, p99 of each per second, and each one's
  // distribution next to the whole mix's.
  var OPS = ["verify_request", "verify_response", "connection_invitation", "credential_offer", "transaction_status"];
  var OP_COLORS = { verify_request: "#1f77b4", verify_response: "#ff7f0e", connection_invitation: "#2ca02c",
    credential_offer: "#9467bd", transaction_status: "#8c564b" };
  var byOp = knee ? {} : data.latency_by_operation || {};
  var ops = OPS.filter(function (op) { return byOp[op]; });
  if (ops.length) {
    root.appendChild(el("h2", {}, "By operation"));
    var opRow = function (name, n, l) { return [name, n, ms(l.p50), ms(l.p90), ms(l.p99), ms(l.p99_9), ms(l.max)]; };
    root.appendChild(table(["operation", "answers", "p50", "p90", "p99", "p99.9", "max"],
      [opRow("all (the mix)", data.responses, data.latency_ms)].concat(ops.map(function (op) {
        return opRow(op, byOp[op].responses, byOp[op].latency_ms);
      }))));
    var olo = Infinity, ohi = 0;
    seconds.forEach(function (p) {
      ops.forEach(function (op) {
        var l = (p.s.latency_by_operation || {})[op];
        if (l) { olo = Math.min(olo, l.p99); ohi = Math.max(ohi, l.p99); }
      });
    });
    if (!isFinite(olo)) { olo = 0.1; ohi = 1; }
    root.appendChild(chart({
      id: "operation-latency", title: "p99 per operation per second", x: xTime,
      note: "Of each operation's answers completed in each second, measured from " + data.latency_from + "; log scale.",
      y: { log: true, lo: olo / 1.5, hi: ohi * 1.5, title: "p99 (ms)" },
      lines: ops.map(function (op) {
        return { name: op, color: OP_COLORS[op],
          points: seconds.map(function (p) { var l = (p.s.latency_by_operation || {})[op]; return [p.x + p.w / 2, l ? l.p99 : null]; }) };
      }),
      markers: markers,
    }));
    var ocap = Math.max(2, Math.log10(Math.max(1, data.responses))), odlo = Infinity, odhi = 0;
    ops.forEach(function (op) {
      byOp[op].latency_distribution.forEach(function (d) { odlo = Math.min(odlo, d.latency_ms); odhi = Math.max(odhi, d.latency_ms); });
    });
    if (!isFinite(odlo)) { odlo = 0.1; odhi = 1; }
    var oTicks = [], oNames = {};
    for (var oe = 0; oe <= Math.floor(ocap); oe++) {
      oTicks.push(oe);
      oNames[oe] = oe === 0 ? "0%" : (100 - Math.pow(10, 2 - oe)).toFixed(Math.max(0, oe - 2)) + "%";
    }
    var distLine = function (name, color, dist, n, dash) {
      return { name: name, color: color, dash: dash, width: dash ? 2.5 : 2,
        points: dist.map(function (d) { return [hdrX(d.percentile / 100, Math.log10(n)), d.latency_ms]; }) };
    };
    root.appendChild(chart({
      id: "operation-distribution", title: "Latency by percentile per operation (HDR)",
      note: "Each operation's answers next to the whole mix (dashed); axes as in the distribution above.",
      x: { lo: 0, hi: ocap, ticks: oTicks, label: function (v) { return oNames[v]; }, title: "percentile" },
      y: { log: true, lo: odlo / 1.5, hi: odhi * 1.5, title: "latency (ms)" },
      lines: ops.map(function (op) {
        return distLine(op, OP_COLORS[op], byOp[op].latency_distribution, byOp[op].responses, false);
      }).concat([distLine("all (the mix)", "#3b4252", data.latency_distribution, data.responses, true)]),
    }));
  }

  // Agents (a run's page): what each one's requests came to.
  var agents = knee ? [] : data.agents || [];
  if (agents.length) {
    root.appendChild(el("h2", {}, "Agents"));
    root.appendChild(table(["agent", "weight", "sent", "answered", "refused (4xx)", "errors", "statuses"], agents.map(function (a) {
      return [el("code", {}, a.id), a.weight, a.requests, a.responses, a.refused, a.errors,
        Object.keys(a.statuses).map(function (k) { return k + ": " + a.statuses[k]; }).join(", ") || "-"];
    })));
    var classOf = function (status) { return status >= 200 && status < 300 ? 0 : status >= 400 && status < 500 ? 1 : 2; };
    var agentClasses = [
      { name: "answered 2xx", color: "#2ca02c" },
      { name: "refused (4xx)", color: "#ff7f0e" },
      { name: "other answers (1xx, 3xx, 5xx)", color: "#d62728" },
      { name: "no answer (failed or unsent)", color: "#6a3d9a" },
    ];
    var counts = agents.map(function (a) {
      var c = [0, 0, 0, 0];
      Object.keys(a.statuses).forEach(function (k) { c[classOf(+k)] += a.statuses[k]; });
      // Its errors less its non-2xx answers: failed and unsent (which `requests` leaves out).
      c[3] = a.errors - (a.responses - c[0]);
      return c;
    });
    var agentStack = agents.map(function () { return 0; });
    var agentBars = agentClasses.map(function (cls, j) {
      var values = [];
      counts.forEach(function (c, k) {
        if (!c[j]) return;
        values.push([k - 0.35, k + 0.35, [agentStack[k], agentStack[k] + c[j]]]);
        agentStack[k] += c[j];
      });
      return { name: cls.name, color: cls.color, values: values };
    }).filter(function (b) { return b.values.length; });
    root.appendChild(chart({
      id: "agents", title: "Requests by agent",
      note: "Each agent's requests by how they ended, stacked; its share of the run is its weight's.",
      x: { lo: -0.5, hi: agents.length - 0.5, ticks: agents.map(function (a, k) { return k; }),
        label: function (k) { return agents[k] ? agents[k].id : ""; }, title: "agent" },
      y: { lo: 0, hi: Math.max.apply(null, agentStack.concat([1])) * 1.1, title: "requests" },
      bars: agentBars,
    }));
  }

  // Parameters, statuses, operations.
  root.appendChild(el("h2", {}, "Parameters"));
  var params = [["target", data.target], ["api", data.api], ["model", model]];
  if (!knee) {
    params.push(["duration", data.duration_s + " s planned, " + sig(data.elapsed_s, 4) + " s elapsed, the last answer at " + sig(data.last_answer_s, 4) + " s" + (data.interrupted ? " (interrupted by Ctrl-C; " + data.cancelled + " in flight abandoned)" : "")]);
    params.push(["latency measured from", data.latency_from]);
    params.push(["timeout", data.timeout_s + " s"]);
  } else {
    params.push(["SLO", data.slo.join(", ")]);
  }
  params.push(["connections", connections], ["mix", data.mix], ["started", data.started_at]);
  if (!knee && data.requests_limit !== null && data.requests_limit !== undefined) params.push(["until", data.requests_limit + " answers (--requests)"]);
  if (!knee && data.headers && data.headers.length) params.push(["headers (-H)", data.headers.join(", ")]);
  root.appendChild(table(["parameter", "value"], params.map(function (p) { return [p[0], el("code", {}, p[1])]; })));
  if (!knee) {
    root.appendChild(el("h2", {}, "Totals"));
    var totals = Object.keys(data.statuses).map(function (k) { return ["HTTP " + k, data.statuses[k]]; })
      .concat(Object.keys(data.errors.connection).map(function (k) { return ["no answer: " + k, data.errors.connection[k]]; }));
    if (data.errors.unsent) totals.push(["unsent (past the deadline)", data.errors.unsent]);
    if (data.late_starts) totals.push(["late starts (> 1 ms after due)", data.late_starts]);
    Object.keys(data.operations).forEach(function (k) { totals.push(["operation " + k, data.operations[k]]); });
    root.appendChild(table(["", "count"], totals));
  }

  // Where each plot area landed, for tests that look at the rendered page.
  charts.forEach(function (c) {
    var b = c.area.getBoundingClientRect();
    c.svg.setAttribute("data-plot-box", [b.left + window.scrollX, b.top + window.scrollY, b.width, b.height].map(Math.round).join(","));
  });
  document.body.setAttribute("data-drawn", String(charts.length));
})();
