"""graft's report: one self-contained HTML page (no scripts, no fetches) a person reads at a
glance: the counters, the steps, the slowest kernels and what each fused, the compiles with
their reasons and threads, the fallbacks with their cost, the waits, and the pictures of the
graphs that took the time. Built from a timeline trace (graft.trace / GRAFT_TRACE) and the
dumps (GRAFT_DUMP_DIR); standard library only, so a C program's trace makes a report too:

    python3 torch/graft/_report.py trace.json -o report.html [--dump-dir D] [--metrics m.txt]
"""
import argparse
import datetime
import html
import json
import os
import re
import statistics

# span categories the trace writes (src/core/trace.c's callers)
_WORK = ("kernel", "gemm", "fallback")
TOP_KERNELS = 25
PICTURES = 3  # the graphs with the most kernel time get their pictures


def _load(trace_path):
    with open(trace_path, encoding="utf-8") as f:
        doc = json.load(f)
    ev = doc["traceEvents"] if isinstance(doc, dict) else doc
    threads = {e["tid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = [e for e in ev if e.get("ph") == "X"]
    return spans, threads


def _graph_of_work(spans):
    """Each kernel, GEMM and fallback span with the graph of the step it ran in (its
    enclosing step span on the same thread)."""
    by_tid = {}
    for e in spans:
        if e["cat"] == "step" or e["cat"] in _WORK:
            by_tid.setdefault(e["tid"], []).append(e)
    out = []
    for es in by_tid.values():
        es.sort(key=lambda e: (e["ts"], -e["dur"]))
        step, nth = None, {}
        for e in es:
            if e["cat"] == "step":
                step, nth = e, {}
                continue
            if e["cat"] == "gemm":  # a graph's GEMMs of one shape, told apart by their order
                k = nth[e["name"]] = nth.get(e["name"], 0) + 1
                if k > 1:
                    e = dict(e, name="%s #%d" % (e["name"], k))
            if step is not None and e["ts"] + e["dur"] <= step["ts"] + step["dur"] + 0.002:
                out.append((step["args"].get("graph", "?"), e))
            else:
                out.append(("?", e))
    return out


def analyse(spans, threads):
    """The report's tables, as plain data (tests read them too)."""
    work = _graph_of_work(spans)
    kern = {}
    for graph, e in work:
        if e["cat"] == "fallback":
            continue
        k = kern.setdefault((graph, e["name"]), {"graph": graph, "name": e["name"], "cat": e["cat"],
                                                  "calls": 0, "us": 0.0, "args": e["args"]})
        k["calls"] += 1
        k["us"] += e["dur"]
    steps = [e for e in spans if e["cat"] == "step"]
    step_us = sum(e["dur"] for e in steps)
    native_us = {}  # per graph: the time of its native steps, where its kernels ran
    for e in steps:
        if "native" in e["name"]:
            g = e["args"].get("graph", "?")
            native_us[g] = native_us.get(g, 0.0) + e["dur"]
    kernels = sorted(kern.values(), key=lambda k: -k["us"])
    for k in kernels:
        a = k["args"]
        k["share"] = k["us"] / native_us[k["graph"]] if native_us.get(k["graph"]) else 0.0
        k["mean_us"] = k["us"] / k["calls"]
        k["fused"] = a.get("fused", "GEMM" if k["cat"] == "gemm" else "")
        k["from"] = a.get("from", "")
        k["at"] = a.get("at", "")
        k["bytes"] = a.get("bytes")
        k["flops"] = a.get("flops")
        secs = k["mean_us"] * 1e-6
        k["gbs"] = k["bytes"] / secs / 1e9 if k["bytes"] and secs > 0 else None
        k["gflops"] = k["flops"] / secs / 1e9 if k["flops"] and secs > 0 else None
    graphs = {}
    for e in steps:
        g = graphs.setdefault(e["args"].get("graph", "?"), {"graph": e["args"].get("graph", "?"), "native": [], "first": []})
        (g["native"] if "native" in e["name"] else g["first"]).append(e["dur"])
    for g in graphs.values():
        g["runs"] = len(g["native"]) + len(g["first"])
        g["native_ms"] = statistics.median(g["native"]) / 1e3 if g["native"] else None
        g["first_ms"] = statistics.median(g["first"]) / 1e3 if g["first"] else None
        g["kernel_us"] = sum(k["us"] for k in kernels if k["graph"] == g["graph"])
    compiles = [{"thread": threads.get(e["tid"], str(e["tid"])), "what": e["name"], "ms": e["dur"] / 1e3,
                 "graph": e["args"].get("graph", ""), "reason": e["args"].get("reason", ""),
                 "instructions": e["args"].get("instructions"), "compiler_runs": e["args"].get("compiler runs"),
                 "kernels_compiled": e["args"].get("kernels compiled"), "kernels_reused": e["args"].get("kernels reused"),
                 "from_disk": e["args"].get("objects from disk"),
                 "ok": e["args"].get("ok", True), "ts": e["ts"]}
                for e in spans if e["cat"] == "compile"]
    compiles.sort(key=lambda c: c["ts"])
    fb = {}
    for graph, e in work:
        if e["cat"] != "fallback":
            continue
        f = fb.setdefault(e["name"], {"op": e["name"], "calls": 0, "us": 0.0, "bytes": 0})
        f["calls"] += 1
        f["us"] += e["dur"]
        f["bytes"] += e["args"].get("bytes", 0)
    waits = {}
    for e in spans:
        if e["cat"] != "wait":
            continue
        w = waits.setdefault((threads.get(e["tid"], str(e["tid"])), e["name"]),
                             {"thread": threads.get(e["tid"], str(e["tid"])), "what": e["name"], "calls": 0, "us": 0.0})
        w["calls"] += 1
        w["us"] += e["dur"]
    other = {}
    for e in spans:
        if e["cat"] in ("transfer", "collective", "pool"):
            o = other.setdefault((e["cat"], e["name"]), {"cat": e["cat"], "name": e["name"], "calls": 0, "us": 0.0, "bytes": 0})
            o["calls"] += 1
            o["us"] += e["dur"]
            o["bytes"] += e["args"].get("bytes", 0)
    syncs = [e for e in spans if e["name"] == "sync"]
    return {
        "kernels": kernels,
        "graphs": sorted(graphs.values(), key=lambda g: -g["kernel_us"]),
        "compiles": compiles,
        "fallbacks": sorted(fb.values(), key=lambda f: -f["us"]),
        "waits": sorted(waits.values(), key=lambda w: -w["us"]),
        "other": sorted(other.values(), key=lambda o: -o["us"]),
        "step_ms": step_us / 1e3,
        "steps": len(steps),
        "syncs": len(syncs),
        "cache_hits": sum(1 for e in spans if e["name"] == "cache hit"),
        "cache_misses": sum(1 for e in spans if e["name"] == "cache miss"),
        "threads": sorted(set(threads.values())),
    }


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1d2330;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d8dde6}
.sub{color:#5b6475} table{border-collapse:collapse;margin:6px 0}
th,td{padding:3px 8px;border-bottom:1px solid #eceff4;text-align:left;vertical-align:top}
th{background:#f3f5f9;font-weight:600} td.n{text-align:right;font-variant-numeric:tabular-nums}
code,.mono{font-family:ui-monospace,monospace;font-size:12px} td .mono{display:inline-block;min-width:16em;max-width:40em}
.cards{display:flex;flex-wrap:wrap;gap:10px} .card{border:1px solid #d8dde6;border-radius:6px;padding:8px 12px;min-width:120px}
.card b{display:block;font-size:20px} .bar{background:#4f7cc9;height:10px;display:inline-block}
.bad{color:#b3261e} details{margin:6px 0} .pic{overflow:auto;max-height:900px;border:1px solid #d8dde6}
pre{background:#f6f8fa;padding:8px;overflow:auto;font-size:12px}
"""


def _runs(words):
    """Ops with their repeats folded: "slice reshape slice reshape slice reshape concat" ->
    "3x(slice reshape) concat" (the longest-saving pattern of 1-4 ops first)."""
    w = words.split()
    out, i = [], 0
    while i < len(w):
        best = (1, 1)  # (pattern length, repeats)
        for n in range(1, 5):
            r = 1
            while w[i + r * n:i + (r + 1) * n] == w[i:i + n] and len(w[i + r * n:i + (r + 1) * n]) == n:
                r += 1
            if r > 1 and (r - 1) * n > (best[1] - 1) * best[0]:
                best = (n, r)
        n, r = best
        pat = " ".join(w[i:i + n])
        out.append(pat if r == 1 else "%dx(%s)" % (r, pat) if n > 1 else "%dx %s" % (r, pat))
        i += n * r
    return " ".join(out)


def _e(x):
    return html.escape("" if x is None else str(x))


def _num(x, fmt):
    return "" if x is None else fmt % x


def _table(head, rows, numeric=()):
    out = ["<table><tr>" + "".join("<th>%s</th>" % _e(h) for h in head) + "</tr>"]
    for r in rows:
        out.append("<tr>" + "".join('<td%s>%s</td>' % (' class="n"' if i in numeric else "", c)
                                    for i, c in enumerate(r)) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _svg(dump_dir, graph):
    """The rendered picture of a graph (graph_<hash>.kernels.svg), as inline SVG, or None."""
    if not dump_dir or not re.fullmatch(r"[0-9a-f]{16}", graph or ""):
        return None
    p = os.path.join(dump_dir, "graph_%s.kernels.svg" % graph)
    if not os.path.exists(p):
        return None
    with open(p, encoding="utf-8") as f:
        s = f.read()
    i = s.find("<svg")
    if i < 0:
        return None
    # scaled to the page's width (an overview; the file itself is full size)
    head, rest = s[i:].split(">", 1)
    head = re.sub(r'\s(width|height)="[^"]*"', "", head) + ' width="100%"'
    return head + ">" + rest


def render(a, metrics=None, metrics_text=None, dump_dir=None, title="graft report", page_dir=None):
    """The page's HTML from analyse()'s tables, graft's counters (a dict) and text report;
    page_dir: where the page goes (its links to the pictures are relative to it)."""
    m = metrics or {}
    cards = [("steps traced", a["steps"]), ("time in steps", "%.1f ms" % a["step_ms"]),
             ("syncs", a["syncs"]), ("cache hits / misses", "%d / %d" % (a["cache_hits"], a["cache_misses"])),
             ("compiles", len(a["compiles"])),
             ("time waiting", "%.1f ms" % (sum(w["us"] for w in a["waits"]) / 1e3))]
    for key, label in (("graphs_compiled", "graphs compiled"), ("fallbacks", "PyTorch fallbacks"),
                       ("fallback_ops", "graft fallback steps"), ("bytes_peak", "peak bytes")):
        if key in m:
            cards.append((label, m[key]))
    h = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>%s</title><style>%s</style></head><body>"
         % (_e(title), _CSS),
         "<h1>%s</h1><div class=\"sub\">%s &middot; threads: %s</div>"
         % (_e(title), _e(datetime.datetime.now().strftime("%Y-%m-%d %H:%M")), _e(", ".join(a["threads"]))),
         '<div class="cards">' + "".join('<div class="card"><b>%s</b>%s</div>' % (_e(v), _e(k)) for k, v in cards) + "</div>"]

    h.append('<h2 id="kernels">Top kernels by time</h2><p class="sub">Kernels, GEMMs of the traced steps, summed over '
             "their runs; share is of the time its graph's native steps took; fused lists the ops a kernel computes (the values it writes "
             "and those inlined into it), from the framework ops that made them, at the source line most of them "
             "came from.</p>")
    top = a["kernels"][:TOP_KERNELS]
    most = (top[0]["us"] if top else 0) or 1
    h.append(_table(["#", "kernel", "graph", "fused", "from (aten)", "source line", "calls", "total ms", "share", "",
                     "mean us", "bytes", "GB/s", "GFLOP/s"],
                    [[str(i + 1), "<code>%s</code>" % _e(k["name"]), "<code>%s</code>" % _e(k["graph"][:8]),
                      '<span class="mono">%s</span>' % _e(_runs(k["fused"])),
                      '<span class="mono">%s</span>' % _e(k["from"].replace("aten::", "")),
                      '<code title="%s">%s</code>' % (_e(k["at"]), _e(os.path.basename(k["at"]))),
                      str(k["calls"]), "%.3f" % (k["us"] / 1e3),
                      "%.1f%%" % (100 * k["share"]),
                      '<span class="bar" style="width:%dpx"></span>' % max(1, int(120 * k["us"] / most)),
                      "%.1f" % k["mean_us"], _num(k["bytes"], "%d"), _num(k["gbs"], "%.1f"), _num(k["gflops"], "%.1f")]
                     for i, k in enumerate(top)], numeric={0, 6, 7, 8, 10, 11, 12, 13}))

    h.append('<h2 id="graphs">Graphs</h2>')
    h.append(_table(["graph", "runs", "native ms (median)", "first tier ms (median)", "kernel time ms"],
                    [["<code>%s</code>" % _e(g["graph"]), str(g["runs"]), _num(g["native_ms"], "%.3f"),
                      _num(g["first_ms"], "%.3f"), "%.3f" % (g["kernel_us"] / 1e3)] for g in a["graphs"]],
                    numeric={1, 2, 3, 4}))

    h.append('<h2 id="compiles">Compiles</h2><p class="sub">First-tier plans on the thread that syncs; native builds '
             "on the compiler thread, or from kernels compiled before on the thread that syncs: the kernel bodies "
             "each compiled, those it found compiled (the kernel library), "
             "the objects it loaded from the disk cache.</p>")
    h.append(_table(["what", "thread", "graph", "ms", "instructions", "compiler runs", "kernels compiled",
                     "kernels reused", "objects from disk", "ok", "reason"],
                    [[_e(c["what"]), _e(c["thread"]), "<code>%s</code>" % _e(c["graph"]), "%.1f" % c["ms"],
                      _num(c["instructions"], "%d"), _num(c["compiler_runs"], "%d"), _num(c["kernels_compiled"], "%d"),
                      _num(c["kernels_reused"], "%d"), _num(c["from_disk"], "%d"),
                      "yes" if c["ok"] else '<span class="bad">no</span>', _e(c["reason"])]
                     for c in a["compiles"]], numeric={3, 4, 5, 6, 7, 8}))

    h.append('<h2 id="fallbacks">Fallbacks</h2><p class="sub">Steps of compiled graphs that ran a host or reference '
             "kernel, with the bytes they read and wrote; then PyTorch ops graft has no lowering for (run by "
             "PyTorch's CPU kernels), by count.</p>")
    h.append(_table(["op", "calls", "total ms", "bytes"],
                    [[_e(f["op"]), str(f["calls"]), "%.3f" % (f["us"] / 1e3), str(f["bytes"])] for f in a["fallbacks"]],
                    numeric={1, 2, 3}) if a["fallbacks"] else "<p>No fallback steps in the traced graphs.</p>")
    aten = sorted(((k, v) for k, v in m.items() if k.startswith("aten::")), key=lambda kv: -kv[1])
    if aten:
        h.append(_table(["aten op", "calls"], [[_e(k), str(v)] for k, v in aten], numeric={1}))

    h.append('<h2 id="waits">Waits</h2>')
    h.append(_table(["thread", "what", "calls", "total ms"],
                    [[_e(w["thread"]), _e(w["what"]), str(w["calls"]), "%.3f" % (w["us"] / 1e3)] for w in a["waits"]],
                    numeric={2, 3}) if a["waits"] else "<p>No waits.</p>")
    if a["other"]:
        h.append('<h2 id="other">Thread pool, transfers, collectives</h2>')
        h.append(_table(["kind", "what", "calls", "total ms", "bytes"],
                        [[_e(o["cat"]), _e(o["name"]), str(o["calls"]), "%.3f" % (o["us"] / 1e3), str(o["bytes"])]
                         for o in a["other"]], numeric={2, 3, 4}))

    h.append('<h2 id="pictures">Graphs as they ran</h2>')
    shown = 0
    for g in a["graphs"][:PICTURES]:
        svg = _svg(dump_dir, g["graph"])
        if svg:
            shown += 1
            full = os.path.join(dump_dir, "graph_%s.kernels.svg" % g["graph"])
            if page_dir:
                full = os.path.relpath(full, page_dir)
            h.append("<details%s><summary>graph <code>%s</code>: %.3f ms of kernels (<a href=\"%s\">full size</a>)"
                     "</summary><div class=\"pic\">%s</div></details>"
                     % (" open" if shown == 1 else "", _e(g["graph"]), g["kernel_us"] / 1e3, _e(full), svg))
    if not shown:
        h.append("<p>No pictures: set <code>GRAFT_DUMP_DIR</code> (or <code>graft.set_dump_dir</code>) while the "
                 "graphs compile, with Graphviz installed.</p>")
    if metrics_text:
        h.append('<h2 id="metrics">Counters</h2><pre>%s</pre>' % _e(metrics_text))
    h.append("</body></html>\n")
    return "\n".join(h)


def write(path, trace_path, metrics=None, metrics_text=None, dump_dir=None, title="graft report"):
    spans, threads = _load(trace_path)
    page = render(analyse(spans, threads), metrics, metrics_text, dump_dir, title,
                  os.path.dirname(os.path.abspath(path)))
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return str(path)


def main(argv=None):
    ap = argparse.ArgumentParser(description="graft's HTML report from a timeline trace (GRAFT_TRACE)")
    ap.add_argument("trace")
    ap.add_argument("-o", "--output", default="graft-report.html")
    ap.add_argument("--dump-dir", default=os.environ.get("GRAFT_DUMP_DIR"), help="GRAFT_DUMP_DIR of the run (pictures)")
    ap.add_argument("--metrics", help="a file holding graft_metrics_report()'s text")
    a = ap.parse_args(argv)
    text = open(a.metrics).read() if a.metrics else None
    print(write(a.output, a.trace, None, text, a.dump_dir))


if __name__ == "__main__":
    main()
