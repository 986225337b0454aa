"""The memory benchmark's report side: goal figures, markdown tables and the chart of a
memory.json (benchmarks/memory.py writes one; --from-json re-renders and merges them)."""
from __future__ import annotations

from common import write_results
from suite import CASE_LABELS

LABELS = {"eager": "eager", "compile": "torch.compile", "ort0": "ORTModule level 0",
          "ort1": "ORTModule level 1", "ort2": "ORTModule level 2"}
ORT = ("ort0", "ort1", "ort2")
PREDICTION_TOLERANCE = 0.10  # predicted within 10% of measured
ACTIVATION_GOALS = {"ort0": 0.7, "ort1": 0.4}  # × eager's activation memory
LEVEL1_EXTRA_TIME = 0.25  # level 1's step time over level 0's
CAP_GOAL = 2.0  # largest batch under the cap, × eager's
MIB = 1 << 20


# --- figures of one row (one process) --------------------------------------------------------------
def ok(r: dict | None) -> bool:
    return bool(r) and "error" not in r


def activation(r: dict, source: str = "allocator") -> float | None:
    """MiB of a step's activations: the allocator's peak, or the RSS rise."""
    if not ok(r):
        return None
    if source == "allocator":
        return r["allocator"]["peak_mib"] if r.get("allocator") else None
    return r["rss"]["activation_mib"]


def _released_peak(d: dict) -> float | None:
    """The step's peak for a loop that lets go of the outputs before backward, as this benchmark's
    does (it keeps only the loss): max(forward peak, backward peak). The report's own 'peak' adds
    the outputs to the backward peak (a caller holding the logits through backward)."""
    if d.get("forward_peak") is not None and d.get("backward_peak") is not None:
        peak = max(d["forward_peak"], d["backward_peak"])
    else:
        peak = d.get("peak")
    return peak / MIB if peak is not None and peak >= 0 else None


def predicted(r: dict) -> float | None:
    return _released_peak(((r or {}).get("ort") or {}).get("predicted") or {})


def engine_measured(r: dict) -> float | None:
    return _released_peak(((r or {}).get("ort") or {}).get("measured") or {})


def _div(a, b):
    return a / b if a is not None and b else None


def _row(entry: dict, variant: str, batch) -> dict | None:
    return entry.get("sweep", {}).get(variant, {}).get(str(batch))


def _step(r: dict | None, fastest: bool = False) -> float | None:
    """The median step time, or the fastest step's (less swayed by other work on the machine)."""
    if not ok(r) or not r.get("times_s"):
        return None
    return min(r["times_s"]) if fastest else r["median_step_s"]


def _extra_time(entry: dict, variant: str, batch, reference: str, fastest: bool = False) -> float | None:
    """variant's step time over reference's at this batch, minus 1 (+0.2: 20% slower)."""
    ratio = _div(*(_step(_row(entry, v, batch), fastest) for v in (variant, reference)))
    return None if ratio is None else ratio - 1


def _batches(entry: dict) -> list[int]:
    return sorted({int(b) for rows in entry.get("sweep", {}).values() for b in rows})


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}×"


def _mib(v) -> str:
    return "-" if v is None else f"{v:,.0f} MiB"


def _pct(v) -> str:
    return "-" if v is None else f"{v:+.0%}"


# --- goals ---------------------------------------------------------------------------------------
def _default_batch(entry: dict) -> int | None:
    """The batch the step-time goal is judged at: the case's own (suite.CASES), else the smallest."""
    batches = _batches(entry)
    own = entry["plan"].get("case_batch")
    return own if own in batches else (batches[0] if batches else None)


Goal = tuple  # (goal, measured, target, met); met is None when not measured


def _prediction_goal(entry: dict, label: str) -> Goal:
    """Every ORTModule row's predicted peak ÷ its allocator-measured activations."""
    ratios = [(v, b, _div(predicted(_row(entry, v, b)), activation(_row(entry, v, b))))
              for v in ORT for b in _batches(entry)]
    ratios = [x for x in ratios if x[2] is not None]
    target = f"{1 - PREDICTION_TOLERANCE:.2f}–{1 + PREDICTION_TOLERANCE:.2f}×"
    goal = f"{label}: predicted peak ÷ measured (allocator), every level and batch"
    if not ratios:
        return goal, "-", target, None
    v, b, worst = max(ratios, key=lambda x: abs(x[2] - 1))
    low, high = min(x[2] for x in ratios), max(x[2] for x in ratios)
    return (goal, f"{low:.2f}–{high:.2f}× ({len(ratios)} rows; worst {LABELS[v]}, batch {b})", target,
            abs(worst - 1) <= PREDICTION_TOLERANCE)


def _activation_goal(entry: dict, label: str, variant: str, target: float) -> Goal:
    """variant's activations ÷ eager's at the batch where the ratio is worst."""
    per_batch = []
    for b in _batches(entry):
        mine, eager = _row(entry, variant, b), _row(entry, "eager", b)
        ratio = _div(activation(mine), activation(eager))
        if ratio is not None:
            per_batch.append((ratio, b, _div(activation(mine, "rss"), activation(eager, "rss"))))
    goal = f"{label}: {LABELS[variant]} activations ÷ eager's"
    if not per_batch:
        return goal, "-", f"≤ {target:.2f}×", None
    ratio, b, rss = max(per_batch)
    return goal, f"{ratio:.2f}× (worst batch, {b}; RSS {_x(rss)})", f"≤ {target:.2f}×", ratio <= target


def _time_goal(entry: dict, label: str) -> Goal:
    """Level 1's median step time over level 0's at the case's own batch."""
    b = _default_batch(entry)
    extra = _extra_time(entry, "ort1", b, "ort0")
    fastest = _extra_time(entry, "ort1", b, "ort0", fastest=True)
    return (f"{label}: level 1 step time over level 0's (batch {b}, medians)",
            _pct(extra) + ("" if fastest is None else f" (fastest steps: {_pct(fastest)})"),
            f"≤ {_pct(LEVEL1_EXTRA_TIME)}", None if extra is None else extra <= LEVEL1_EXTRA_TIME)


def _bounds(s: dict) -> tuple[int, float]:
    """(lowest, highest) the largest batch can be: a search stopped early leaves a range."""
    high = s["first_not_fitting"] - 1 if s.get("first_not_fitting") else float("inf")
    return s["largest"], (s["largest"] if s["exact"] else high)


def _range(s: dict) -> str:
    low, high = _bounds(s)
    return f"{low}" if low == high else f"{low}–{high:g}" if high != float("inf") else f"≥ {low}"


def _cap_goal(entry: dict, label: str) -> Goal:
    """The best ORTModule level's largest batch under the cap ÷ eager's; a search stopped by its
    probe limit gives a range, and the goal is undecided when the range straddles the target."""
    cap = entry.get("cap") or {}
    goal = f"{label}: largest batch under {entry['plan']['cap_gb']:g} GiB, best level ÷ eager's"
    found = [(_bounds(cap[v]), v) for v in ORT if (cap.get(v) or {}).get("largest")]
    if not found or not (cap.get("eager") or {}).get("largest"):
        return goal, "-", f"≥ {CAP_GOAL:.1f}×", None
    (best_low, best_high), variant = max(found)
    eager_low, eager_high = _bounds(cap["eager"])
    low, high = best_low / eager_high, best_high / eager_low
    ratio = (f"{low:.2f}×" if low == high else f"≥ {low:.2f}×" if high == float("inf")
             else f"{low:.2f}–{high:.2f}×")
    met = True if low >= CAP_GOAL else False if high < CAP_GOAL else "undecided"
    return (goal, f"{ratio} ({LABELS[variant]} {_range(cap[variant])}, eager {_range(cap['eager'])})",
            f"≥ {CAP_GOAL:.1f}×", met)


def goals(result: dict) -> list[Goal]:
    """The goal figures, per case. Activations are the allocator's (RSS in brackets)."""
    rows = []
    for case, entry in result["cases"].items():
        label = CASE_LABELS.get(case, case)
        rows.append(_prediction_goal(entry, label))
        rows += [_activation_goal(entry, label, v, t) for v, t in ACTIVATION_GOALS.items()]
        rows += [_time_goal(entry, label), _cap_goal(entry, label)]
    return rows


# --- markdown ------------------------------------------------------------------------------------
SWEEP_COLUMNS = ("variant", "batch", "process peak RSS", "step peak RSS", "RSS before step",
                 "activations: RSS", "activations: allocator", "÷ eager's", "predicted",
                 "predicted ÷ allocator", "engine measured", "predicted ÷ engine", "recompute on",
                 "median step (fastest)", "vs level 0", "vs eager")


def _recompute(r: dict) -> str:
    rows = ((r.get("ort") or {}).get("rows")) if ok(r) else None
    if rows is None:
        return "-"
    on = [x for x in rows if x["enabled"]]
    return f"{len(on)} of {len(rows)} plans ({_mib(sum(x['bytes_saved'] for x in on) / MIB)})"


def _sweep_row(entry: dict, variant: str, batch: str) -> str:
    r = entry["sweep"][variant][batch]
    if not ok(r):
        error = r["error"][:120].replace("|", "/")
        return f"| {LABELS[variant]} | {batch} | failed: {error} |" + " |" * (len(SWEEP_COLUMNS) - 3)
    p, alloc, eng, step = predicted(r), activation(r), engine_measured(r), _step(r)
    ort_error = (r.get("ort") or {}).get("error")
    cells = [LABELS[variant], batch, _mib(r["process_peak_rss_mib"]), _mib(r["rss"]["step_peak_mib"]),
             _mib(r["rss"]["before_mib"]), _mib(activation(r, "rss")), _mib(alloc),
             _x(_div(alloc, activation(_row(entry, "eager", batch)))),
             f"- ({ort_error[:60]})" if p is None and ort_error else _mib(p), _x(_div(p, alloc)), _mib(eng),
             _x(_div(p, eng)), _recompute(r),
             "-" if step is None else f"{step:.3f} s ({_step(r, fastest=True):.3f} s)",
             _pct(_extra_time(entry, variant, batch, "ort0")) if variant in ORT[1:] else "-",
             _pct(_extra_time(entry, variant, batch, "eager")) if variant != "eager" else "-"]
    return "| " + " | ".join(str(x) for x in cells) + " |"


def _cap_table(entry: dict) -> list[str]:
    cap, plan = entry["cap"], entry["plan"]
    eager = (cap.get("eager") or {}).get("largest")
    skipped = ", ".join(LABELS[v] for v in entry["sweep"] if v not in cap)
    lines = ["", f"Largest batch whose process peak RSS (export or compilation included) stays under "
             f"{plan['cap_gb']:g} GiB: doubling, then bisection; two steps per probe; the sweep's processes "
             "above (and, with --known-from, an earlier run's probes) count as probes too." + (f" Not searched: {skipped}." if skipped else ""), "",
             "| variant | largest batch | × eager's | probes (batch: peak RSS, fits) |", "|---|---|---|---|"]
    for variant, s in cap.items():
        largest = "-" if s["largest"] is None else _range(s)
        if s.get("stopped"):
            largest += f" ({s['stopped'][:120]})"
        probes = [f"{p['batch']}: " + (f"error {p['error'][:60]}" if "error" in p else
                                       "killed past the cap ✗" if "killed" in p else
                                       f"{_mib(p['peak_rss_mib'])} {'✓' if p['fits'] else '✗'}")
                  for p in s["probes"]]
        known = [f"{b}: " + ("killed past the cap" if m == float("inf") else _mib(m))
                 for b, m in sorted(s["known_from_sweep"].items(), key=lambda x: int(x[0]))]
        lines.append(f"| {LABELS[variant]} | {largest} | {_x(_div(s['largest'], eager))} | "
                     + (", ".join(probes) or "-") + (f" (known before: {', '.join(known)})" if known else "")
                     + " |")
    return lines


def _case_table(entry: dict, case: str) -> list[str]:
    c, plan = entry["config"], entry["plan"]
    lines = ["", f"## {CASE_LABELS.get(case, case)}", "",
             f"{c['layers']} layers, {c['heads']} heads, width {c['width']}, context {c['context']}, vocab "
             f"{c['vocab']}, fp32, AdamW; median of {plan['steps']} steps after {plan['warmup']} warm-up.",
             "", "| " + " | ".join(SWEEP_COLUMNS) + " |", "|" + "---|" * len(SWEEP_COLUMNS)]
    for variant, rows in entry["sweep"].items():
        lines += [_sweep_row(entry, variant, b) for b in sorted(rows, key=int)]
    return lines + (_cap_table(entry) if entry.get("cap") is not None else [])


def _rss_methods(result: dict) -> str:
    methods = {r["rss_method"] for e in result["cases"].values() for rows in e.get("sweep", {}).values()
               for r in rows.values() if ok(r)}
    return "; ".join(sorted(methods)) or "-"


def markdown(result: dict) -> list[str]:
    verdict = {True: "met", False: "not met", None: "not measured",
               "undecided": "undecided (the searches stopped at their probe limit)"}
    malloc = ", ".join(f"{k}={v}" for k, v in result.get("malloc", {}).items()) or "glibc's defaults"
    lines = [f"# Memory benchmark, {result['date']}", "",
             f"Machine: {result['machine']}; {result['cpu']}. Command: `{result.get('command', '-')}`. Each "
             f"variant and batch size in its own process, glibc malloc with {malloc} in every one"
             + (" (each block of 64 KiB or more mapped alone and unmapped when freed, so RSS follows the "
                "allocator; with glibc's defaults freed activations stay resident and a step's RSS rise "
                "shows a fraction of them)" if malloc.startswith("MALLOC_MMAP") else "") + ".", "",
             "Activations of a steady-state step (optimizer state allocated, gradients None), measured two "
             f"ways: **RSS**, the peak resident set during forward + backward ({_rss_methods(result)}) "
             "minus the RSS right before the forward; **allocator**, the peak of the bytes torch's CPU "
             "allocator handed out during forward + backward of another such step (torch.profiler, "
             "profile_memory=True), parameter gradients included. The goal figures use the allocator's "
             "(no page or malloc granularity; the RSS figure is beside it). *Predicted*: "
             "ORTModule.memory_report(batch).predicted before the first step, the peak of a step whose "
             "caller lets go of the outputs before backward as this loop does (max of the forward and "
             "backward peaks: 'peak_outputs_released'); *engine measured*: the same from its .measured "
             "after the steps. *Process peak RSS*: the whole process's, export or "
             "compilation included; *step peak RSS*: the steady-state step's, optimizer included. Step "
             "times can swing 2-4× from one step to the next on a shared VM, so the fastest step is shown "
             "beside the median.", "", "## Goals", "",
             "| goal | measured | target | met |",
             "|---|---|---|---|"]
    loads = [r.get("load_before", 0) for e in result["cases"].values() for rows in e.get("sweep", {}).values()
             for r in rows.values()]
    if result.get("cores") and loads and max(loads) > 0.5 * result["cores"]:
        lines[6:6] = [f"**Other work was running**: other processes kept up to {max(loads):.1f} of "
                      f"{result['cores']} cores busy just before a process started; step times are skewed "
                      "(memory figures are not).", ""]
    lines += [f"| {g} | {m} | {t} | {verdict[v]} |" for g, m, t, v in goals(result)]
    for case, entry in result["cases"].items():
        lines += _case_table(entry, case)
    return lines


# --- chart, files --------------------------------------------------------------------------------
def chart(result: dict, path: str) -> None:
    """Per case: activation MiB against batch size per variant (predicted dashed), and the largest
    batch under the cap."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cases = list(result["cases"])
    fig, axes = plt.subplots(2, len(cases), figsize=(6.5 * len(cases), 8), squeeze=False)
    for j, case in enumerate(cases):
        entry, act, cap = result["cases"][case], axes[0][j], axes[1][j]
        for i, variant in enumerate(entry["sweep"]):
            pts = [(b, activation(_row(entry, variant, b))) for b in _batches(entry)]
            pts = [(b, v) for b, v in pts if v is not None]
            if pts:
                act.plot(*zip(*pts), marker="o", color=f"C{i}", label=LABELS[variant])
            pred = [(b, predicted(_row(entry, variant, b))) for b in _batches(entry)]
            pred = [(b, v) for b, v in pred if v is not None]
            if pred:
                act.plot(*zip(*pred), marker="x", linestyle="--", color=f"C{i}",
                         label=f"{LABELS[variant]}, predicted")
        act.set_title(f"{CASE_LABELS.get(case, case)}: step activations (allocator)", fontsize=9)
        act.set_xlabel("batch")
        act.set_ylabel("MiB")
        act.legend(fontsize=7)
        searched = [(v, s["largest"] or 0) for v, s in (entry.get("cap") or {}).items()]
        if not searched:
            cap.axis("off")
            cap.text(0.5, 0.5, "largest batch: not searched", ha="center", transform=cap.transAxes)
            continue
        bars = cap.bar([LABELS[v] for v, _ in searched], [n for _, n in searched],
                       color=[f"C{list(entry['sweep']).index(v)}" if v in entry["sweep"] else "grey"
                              for v, _ in searched])
        cap.bar_label(bars, fontsize=8)
        cap.set_title(f"largest batch under {entry['plan']['cap_gb']:g} GiB peak RSS", fontsize=9)
        cap.tick_params(axis="x", labelsize=7, rotation=15)
    fig.suptitle(f"torch_ort memory benchmark, {result['date']}: {result['machine']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def merge(results: list[dict]) -> dict:
    """One result with every case, variant and batch of `results` (runs of different variants or
    batches combine; a later file's row or search replaces an earlier one's). The header is the
    first file's."""
    merged = dict(results[0], cases={})
    for r in results:
        for case, entry in r["cases"].items():
            into = merged["cases"].setdefault(case, dict(entry, sweep={}, cap=None))
            for variant, rows in entry.get("sweep", {}).items():
                into["sweep"].setdefault(variant, {}).update(rows)
            if entry.get("cap") is not None:
                into["cap"] = dict(into["cap"] or {}, **entry["cap"])
    if len(results) > 1:
        merged["command"] = " ; ".join(dict.fromkeys(r.get("command", "-") for r in results))
    return merged


def write(result: dict, out_dir: str) -> list[str]:
    """memory.json, memory.md and memory.png in out_dir; returns the markdown lines."""
    return write_results(result, out_dir, "memory", markdown, chart)
