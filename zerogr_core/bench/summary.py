"""Plain-text summary tables of benchmark records (what a run prints last)."""
from __future__ import annotations

from collections import defaultdict

METHOD_ORDER = ["zerogr", "static", "static-adapted", "unconstrained", "cpu-trie", "naive-selective"]
#: The anchor figures (docs/design.md §8): measured on the lent H200 for search-like at 1.93e7 SIDs, beam 128 (ms).
ANCHORS = {
    ("fp16", 1024): {"unconstrained": {1: 0.96, 8: 2.80, 32: 7.74}, "static-official": {1: 1.96, 8: 2.01, 32: 3.69},
                     "full-gemms": {1: 0.10, 8: 0.28, 32: 0.95}},
    ("fp32", 4096): {"unconstrained": {1: 2.8, 8: 17.2, 32: 54.9}, "static-official": {1: 3.4, 8: 17.0, 32: 54.5}},
}
#: Issue 3's targets for zerogr (ms) on that catalog.
TARGETS = {("fp16", 1024): {32: 0.35, 1: 0.15}, ("fp32", 4096): {32: 2.5}}
ANCHOR_ITEMS = 19_269_255

SHORT = {"zerogr": "zerogr", "static": "static", "static-adapted": "st-adapt", "unconstrained": "unconstr",
         "cpu-trie": "cpu-trie", "naive-selective": "naive-sel"}


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def _ms(v) -> str:
    return "-" if v is None else (f"{v:.3f}" if v < 10 else f"{v:.1f}")


def _best(per_mode: dict):
    """(ms, mode) of a method at a shape: graph replay when captured, else eager."""
    if "graph" in per_mode:
        return per_mode["graph"], "graph"
    if "eager" in per_mode:
        return per_mode["eager"], "eager"
    return None, None


def latency_tables(records: list[dict]) -> list[str]:
    groups: dict = defaultdict(lambda: defaultdict(dict))
    anchored = set()
    for r in records:
        if r.get("kind") != "latency" or r.get("status") != "ok":
            continue
        key = (r["suite"], r.get("catalog_label"), r.get("dtype"), r.get("hidden"), r.get("beam"))
        groups[key][int(r["batch"])].setdefault(r["method"], {})[r["mode"]] = r["median_ms"]
        if r.get("catalog") == "search-like" and r.get("beam") == 128 and r.get("n_items") and \
                abs(r["n_items"] / ANCHOR_ITEMS - 1) < 0.1 and r.get("codebook") in (None, ""):
            anchored.add(key)
    out = []
    for (suite, cat, dtype, hidden, beam), by_batch in sorted(groups.items(), key=lambda kv: str(kv[0])):
        methods = [m for m in METHOD_ORDER if any(m in d for d in by_batch.values())]
        baselines = [m for m in methods if m != "zerogr"]
        header = ["batch"] + [SHORT[m] + " ms" for m in methods] + [f"x{SHORT[m]}" for m in baselines
                                                                     if "zerogr" in methods]
        rows = []
        for batch in sorted(by_batch):
            d = by_batch[batch]
            row = [str(batch)]
            for m in methods:
                v, mode = _best(d.get(m, {}))
                row.append(_ms(v) + ("e" if mode == "eager" else ""))
            z, _ = _best(d.get("zerogr", {}))
            if "zerogr" in methods:
                for m in baselines:
                    v, _ = _best(d.get(m, {}))
                    row.append("-" if v is None or not z else f"{v / z:.1f}")
            rows.append(row)
        text = (f"[{suite}] {cat}  {dtype}/H{hidden}  beam {beam}  (median ms of whole decodes; graph "
                f"replay, 'e' = eager only; xM = M's time / zerogr's)\n" + _table(rows, header))
        anchor = ANCHORS.get((dtype, hidden))
        if (suite, cat, dtype, hidden, beam) in anchored and anchor:
            lines = []
            for batch in sorted(set(by_batch) & {1, 8, 32}):
                z, _ = _best(by_batch[batch].get("zerogr", {}))
                if not z:
                    continue
                st, un = anchor["static-official"].get(batch), anchor["unconstrained"].get(batch)
                target = TARGETS.get((dtype, hidden), {}).get(batch)
                lines.append(f"  b{batch}: zerogr {z:.3f} ms" + (f" (target ≤ {target} ms)" if target else "") +
                             (f"; STATIC official {st} ms → x{st / z:.1f}" if st else "") +
                             (f"; unconstrained (anchor) {un} ms → x{un / z:.1f}" if un else ""))
            if lines:
                text += "\n  vs the anchor figures (STATIC's official code on the same GPU):\n" + "\n".join(lines)
        out.append(text)
    return out


def step_tables(records: list[dict]) -> list[str]:
    by: dict = defaultdict(dict)
    for r in records:
        if r.get("kind") == "step" and r.get("step") != "sum":
            key = (r.get("catalog_label"), r["dtype"], r["hidden"], r["batch"], r["method"], r["mode"])
            by[key][int(r["step"])] = r["median_us"]
    if not by:
        return []
    table = []
    for k, v in sorted(by.items(), key=lambda kv: str(kv[0])):
        steps = "/".join(f"{v[s]:.0f}" for s in sorted(v))
        table.append([str(k[0]), f"{k[1]}/H{k[2]}", str(k[3]), k[4], k[5], steps, f"{sum(v.values()):.0f}"])
    return ["[steps] per-step latency, each step timed alone (µs)\n" +
            _table(table, ["catalog", "config", "batch", "method", "mode", "per step", "sum"])]


def plan_tables(records: list[dict]) -> list[str]:
    """The warm-up plan of every zerogr shape: mode and top-k path per step, planned µs."""
    table = []
    for r in records:
        if r.get("kind") == "plan" and r.get("plan_modes"):
            steps = " ".join(m.replace("sparse+", "s+").replace("dense+", "d+") for m in r["plan_modes"].split("/"))
            table.append([str(r.get("catalog_label")), f"{r['dtype']}/H{r['hidden']}", str(r.get("beam")),
                          str(r["batch"]), steps, f"{r.get('plan_total_us', float('nan')):.0f}"])
    if not table:
        return []
    table.sort(key=lambda row: (row[0], row[1], int(row[2] or 0), int(row[3])))
    return ["[plans] zerogr warm-up plan per shape (mode:top-k per step; s+ = sparse+, d+ = dense+)\n" +
            _table(table, ["catalog", "config", "beam", "batch", "steps", "planned µs"])]


def stage_tables(records: list[dict]) -> list[str]:
    rows = []
    for r in records:
        if r.get("kind") == "stage" and r.get("step") == "sum":
            rows.append(r)
    if not rows:
        return []
    by: dict = defaultdict(dict)
    for r in rows:
        by[(r.get("catalog_label"), r["dtype"], r["hidden"], r["batch"])][r["stage"]] = r["median_us"]
    stages = ["filtering+projection", "normalisation", "selection+gather", "unfused total", "fused step"]
    table = [[str(k[0]), f"{k[1]}/H{k[2]}", str(k[3])] + [f"{v.get(s, float('nan')):.1f}" for s in stages]
             for k, v in sorted(by.items(), key=lambda kv: str(kv[0]))]
    return ["[stages] zerogr, sum over steps of each stage's own graph (µs)\n" +
            _table(table, ["catalog", "config", "batch"] + stages)]


def ablation_tables(records: list[dict]) -> list[str]:
    by: dict = defaultdict(dict)
    for r in records:
        if r.get("kind") == "ablation" and r.get("part") == "filtering+projection":
            key = (r.get("catalog_label"), r["dtype"], r["hidden"], r["batch"], r.get("valid_logits"))
            prev = by[key].get(r["variant"])
            if prev is None or r["mode"] == "graph":
                by[key][r["variant"]] = (r["median_us"], r["mode"])
    if not by:
        return []
    variants = ["full projection", "naive selective", "slot-based selective"]
    table = []
    for k, v in sorted(by.items(), key=lambda kv: str(kv[0])):
        cells = []
        for name in variants:
            t = v.get(name)
            cells.append("-" if t is None else f"{t[0]:.1f}" + ("e" if t[1] == "eager" else ""))
        table.append([str(k[0]), f"{k[1]}/H{k[2]}", str(k[3]), str(k[4])] + cells)
    return ["[ablation] step 2, filtering+projection (µs; 'e' = eager)\n" +
            _table(table, ["catalog", "config", "batch", "valid logits"] + variants)]


def memory_tables(records: list[dict]) -> list[str]:
    rows = [r for r in records if r.get("kind") == "memory" and r.get("step") == "total"]
    if not rows:
        return []
    table = [[str(r.get("catalog_label")), r["structure"], f"{r['bytes'] / 2**20:.1f}",
              f"{r.get('ratio_to_sid_table', float('nan')):.3f}", f"{r.get('ratio_to_zerogr', float('nan')):.2f}"]
             for r in rows]
    return ["[memory] index bytes\n" + _table(table, ["catalog", "structure", "MiB", "x SID int16", "x zerogr"])]


def build_tables(records: list[dict]) -> list[str]:
    rows = [r for r in records if r.get("kind") == "build"]
    out = []
    if rows:
        table = [[str(r.get("catalog_label")), r["builder"], f"{r['total_s']:.2f}",
                  str(r.get("identical_to_zerogr_index", ""))] for r in rows]
        out.append("[build] construction time (s, median)\n" + _table(table, ["catalog", "builder", "s", "identical"]))
    bw = [r for r in records if r.get("kind") == "bandwidth"]
    if bw:
        table = [[str(r.get("catalog_label")), r["structure"], f"{r['bytes'] / 2**20:.0f}",
                  f"{r['window_60s_gbps'] * 1e3:.1f}", f"{r['window_90s_gbps'] * 1e3:.1f}",
                  f"{r.get('h2d_pinned_gbps', float('nan')):.1f}"] for r in bw]
        out.append("[build] H2D bandwidth needed to ship the index within an update window\n" +
                   _table(table, ["catalog", "structure", "MiB", "MB/s @60s", "MB/s @90s", "pinned GB/s"]))
    return out


def interference_tables(records: list[dict]) -> list[str]:
    rows = [r for r in records if r.get("kind") == "interference"]
    if not rows:
        return []
    table = [[str(r.get("catalog_label")), f"{r['dtype']}/H{r['hidden']}", str(r["batch"]), r["condition"],
              _ms(r.get("median_ms")), _ms(r.get("p99_ms")), str(r.get("n")), str(r.get("rebuilds"))] for r in rows]
    return ["[interference] zerogr decode latency (ms) with and without a concurrent rebuild\n" +
            _table(table, ["catalog", "config", "batch", "condition", "p50", "p99", "n", "rebuilds"])]


def coldstart_tables(records: list[dict]) -> list[str]:
    rows = [r for r in records if r.get("kind") == "first-decode"]
    if not rows:
        return []
    table = [[str(r.get("catalog_label")), f"{r['dtype']}/H{r['hidden']}", str(r["beam"]), str(r["batch"]),
              r["phase"], f"{r['first_decode_s']:.2f}", f"{r['target_s']:.0f}", str(r.get("plan_source")),
              str(r.get("options_timed")), str(r.get("options_skipped"))] for r in rows]
    return ["[coldstart] first decode of a shape in a fresh process (s; cold = empty plan and Triton caches)\n" +
            _table(table, ["catalog", "config", "beam", "batch", "caches", "first s", "target s", "plan",
                           "timed", "skipped"])]


def check_lines(records: list[dict]) -> list[str]:
    checks = [r for r in records if r.get("kind") == "check"]
    errors = [r for r in records if r.get("kind") == "error"]
    skipped = [r for r in records if r.get("kind") == "skipped"]
    failed = [r for r in checks if not r.get("passed")]
    lines = [f"[checks] {len(checks) - len(failed)}/{len(checks)} passed; {len(errors)} errors; "
             f"{len(skipped)} skipped units"]
    for r in failed[:12]:
        lines.append(f"  FAILED {r.get('suite')} {r.get('method')} {r.get('dtype')}/H{r.get('hidden')} "
                     f"b{r.get('batch')}: {r.get('check')} ({r.get('status', '')})")
    for r in errors[:12]:
        lines.append(f"  ERROR {r.get('suite')} {r.get('what')}: {r.get('error')}")
    for r in skipped[:6]:
        lines.append(f"  skipped {r.get('suite')} {r.get('what')}: {r.get('reason')}")
    return ["\n".join(lines)]


def summary_text(records: list[dict]) -> str:
    parts = (latency_tables(records) + plan_tables(records) + step_tables(records) + stage_tables(records)
             + ablation_tables(records) + memory_tables(records) + build_tables(records)
             + interference_tables(records) + coldstart_tables(records) + check_lines(records))
    return "\n\n".join(parts)
