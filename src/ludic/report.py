"""Run reports: one self-contained ``report.html`` per run directory, rebuilt from its JSONL files.

    ludic report runs/qa-20261123-1200            (re)write runs/.../report.html

What the page shows, in this order, from the files a run writes: the headline score per stage with
its 95% interval, the learning curves, the trajectories, games, the config, then every result (folded):
    ``metrics.jsonl``   learning curves, one inline SVG each, one point per row that carries the metric, by
                        importance (``importance``): outcomes (success, reward, evaluation) first, then the
                        optimisation (loss, KL, entropy, clipping, lengths), then the rest, timings last; series
                        that never change are folded at the end
    ``learning_curves.png``  a recipe's own picture (the tic-tac-toe recipe's), embedded
    ``*.json`` results  evaluation tables (``report.json``, ``qa_results.json``, ``summary.json``)
    ``rollouts.jsonl``, ``eval_*.jsonl``, ``decisions_*.jsonl``  the trajectory viewer (``ludic.report_viewer``):
                        every turn's prompt, reply and reward, filters by outcome, stage and instance, and two
                        stages side by side on the same instances; with a tokenizer, the first training
                        episodes token by token, the trained (sampled) tokens marked
    ``games.jsonl``     games on a board, move by move (the tic-tac-toe recipe's final policy against minimax)

A multi-stage run (the recipe's sft/ and rl/ folders) gets each stage's curves too, and its episodes in the viewer.
No scripts, fonts or images are fetched: the file opens offline and can be mailed.
Every recipe's logger writes it when the run ends (``ReportLogger``).
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Any, Iterable

from ludic import report_viewer

OUTCOME_CURVES = ("success_rate", "reward_mean", "non_loss_rate", "win_rate", "score", "accuracy", "correct_rate",
                  "draw_rate", "loss_rate")
"""What the run is for: plotted first, in this order (an ``eval/`` or ``val/`` series before its training twin)."""
CURVES = OUTCOME_CURVES + (
    "loss", "policy_loss", "value_loss", "kl", "kl_loss", "sampler_kl", "entropy", "clip_frac",
    "completion_tokens_mean", "sequence_tokens_per_episode", "parse_error_rate", "invalid_answer_rate", "illegal_rate",
    "zero_var_group_share", "stale_dropped", "stale_share", "grad_norm", "lr",
)
"""Plotted first, in this order; other numeric series follow, timings and interval bounds last."""
SKIP = {"step", "time"}
RESULT_FILES = ("report.json", "qa_results.json", "tinker_results.json", "summary.json")
PICTURES = ("learning_curves.png",)
"""Pictures a recipe draws into its run directory, embedded in the page (as data URIs: the page stays one file)."""
MAX_PICTURE_BYTES = 3 * 2**20
"""A larger picture is linked (a relative <img>), not embedded."""
_EVAL_PREFIXES = ("eval/", "val/", "test/")
_LOW = ("_s", "_per_s", "minutes", "version", "_ci95_low", "_ci95_high", "_total", "_count", "episodes", "_tokens")


def _read_jsonl(path: Path, limit: int | None = None) -> list[dict]:
    rows: list[dict] = []
    if not path.exists():
        return rows
    with path.open() as f:
        for line in f:
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a line cut by a crash: the rest of the report still renders
    return rows[-limit:] if limit else rows


def importance(name: str) -> tuple[int, int, int, str]:
    """Sort key of a series: outcomes first (``OUTCOME_CURVES``), then the rest of ``CURVES``, then other series,
    then timings, counts and interval bounds; an ``eval/``, ``val/`` or ``test/`` series before its training twin."""
    base = name.split("/")[-1]
    evaluated = 0 if name.startswith(_EVAL_PREFIXES) else 1
    if base in CURVES:
        return (0 if base in OUTCOME_CURVES else 1), CURVES.index(base), evaluated, name
    return (3 if base.endswith(_LOW) else 2), 0, evaluated, name


def series(rows: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """``{metric: [(step, value), ...]}`` for every finite numeric metric, by ``importance``."""
    out: dict[str, list[tuple[float, float]]] = {}
    for i, r in enumerate(rows):
        x = float(r.get("step", i))
        for k, v in r.items():
            if k in SKIP or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            out.setdefault(k, []).append((x, float(v)))
    return {k: out[k] for k in sorted(out, key=importance)}


def _ticks(lo: float, hi: float) -> tuple[str, str]:
    """Axis labels of a range: 3 significant digits, more when 3 would print both ends alike."""
    for digits in range(3, 8):
        a, b = f"{lo:.{digits}g}", f"{hi:.{digits}g}"
        if a != b:
            break
    return a, b


def svg_plot(name: str, points: list[tuple[float, float]], w: int = 320, h: int = 170, x_label: str = "step") -> str:
    """A line plot with one ``<circle class="pt">`` per point, its axes' ranges as labels.

    The left margin fits the longest y label: a fixed one clipped the labels' first characters at the SVG's edge,
    so a negative label lost its minus sign (``-0.00123`` read ``0.00123``)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - 1, y1 + 1
    bottom, top = _ticks(y0, y1)
    left, right = _ticks(x0, x1)
    pad_l, pad_r, pad_t, pad_b = 10 + 6.5 * max(len(top), len(bottom), 3), 10, 22, 22

    def px(x: float) -> float:
        return pad_l + (x - x0) / (x1 - x0) * (w - pad_l - pad_r)

    def py(y: float) -> float:
        return h - pad_b - (y - y0) / (y1 - y0) * (h - pad_t - pad_b)

    coords = [(px(x), py(y)) for x, y in points]
    line = " ".join(f"{a:.1f},{b:.1f}" for a, b in coords)
    dots = "".join(f'<circle class="pt" cx="{a:.1f}" cy="{b:.1f}" r="2.2"><title>{x_label} {x:g}: {y:.4g}</title></circle>'
                   for (a, b), (x, y) in zip(coords, points))
    label = html.escape(name)
    return (
        f'<svg class="plot" data-metric="{label}" data-points="{len(points)}" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" xmlns="http://www.w3.org/2000/svg">'
        f'<text x="{pad_l:.0f}" y="14" class="title">{label}</text>'
        f'<rect x="{pad_l:.1f}" y="{pad_t}" width="{w - pad_l - pad_r:.1f}" height="{h - pad_t - pad_b}" class="frame"/>'
        f'<text x="{pad_l - 4:.1f}" y="{pad_t + 8}" class="ax y1" text-anchor="end">{top}</text>'
        f'<text x="{pad_l - 4:.1f}" y="{h - pad_b}" class="ax y0" text-anchor="end">{bottom}</text>'
        f'<text x="{pad_l:.1f}" y="{h - 6}" class="ax">{left}</text>'
        f'<text x="{w - pad_r}" y="{h - 6}" class="ax" text-anchor="end">{x_label} {right}</text>'
        f'<polyline points="{line}" class="line"/>{dots}</svg>'
    )


def curves_html(rows: list[dict], prefix: str = "") -> str:
    """Every series of ``rows`` as a plot, by ``importance``; those that never change folded at the end, except the
    outcomes (``OUTCOME_CURVES``: a success rate stuck at 0 is the run's main news)."""
    all_series = series(rows)
    flat = [k for k, v in all_series.items() if len({y for _, y in v}) == 1 and importance(k)[0]]  # outcomes stay
    plots = "".join(svg_plot(prefix + k, v) for k, v in all_series.items() if k not in flat)
    if flat:
        values = ", ".join(f"{html.escape(prefix + k)} = {all_series[k][0][1]:.4g}" for k in flat)
        plots += (f"<details class='flat'><summary>{len(flat)} constant series (the same value at every step)</summary>"
                  f"<p>{values}</p><div class='plots'>"
                  + "".join(svg_plot(prefix + k, all_series[k]) for k in flat) + "</div></details>")
    return plots


def _flatten(d: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(d, list) and d and all(isinstance(x, dict) for x in d):
        return  # long per-row lists (curves) are plotted or skipped, not tabulated
    else:
        yield prefix, d


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    s = json.dumps(v) if isinstance(v, (list, dict)) else str(v)
    return s if len(s) <= 160 else s[:157] + "..."


KEY_RESULTS = ("non_loss", "accuracy", "win_rate", "pass@", "score", "value_preserving", "legal")
"""Result rows shown first (a substring of the row's name), in this order."""


def _stage_columns(data: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(stages, rest) when the results are per stage ({"before": {...}, "after": {...}} or the recipe's
    {"results": {"base": ..., "sft": ..., "rl": ...}}): a table with one column per stage reads better."""
    if not isinstance(data, dict):
        return None
    for key in ("results", None):
        node = data.get(key) if key else data
        if isinstance(node, dict) and len(node) >= 2:
            stages = {k: v for k, v in node.items() if isinstance(v, dict) and k != "kept"}  # kept: keep-best's note
            if len(stages) >= 2:
                rest = {k: v for k, v in data.items() if k != key} if key else {k: v for k, v in node.items() if k not in stages}
                return stages, rest
    return None


def _rank(name: str) -> tuple[int, str]:
    return next((i for i, k in enumerate(KEY_RESULTS) if k in name), len(KEY_RESULTS)), name


def result_tables(run_dir: Path) -> str:
    parts = []
    for name in RESULT_FILES:
        path = run_dir / name
        if not path.exists():
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            parts.append(f"<h3>{name}</h3><p class='err'>unreadable: {html.escape(str(e))}</p>")
            continue
        split = _stage_columns(data)
        if split is not None:
            stages, data = split
            cells: dict[str, dict[str, Any]] = {}
            for stage, values in stages.items():
                for k, v in _flatten(values):
                    cells.setdefault(k, {})[stage] = v
            head = "<tr><th></th>" + "".join(f"<th>{html.escape(s)}</th>" for s in stages) + "</tr>"
            body = "".join(f"<tr><td>{html.escape(k)}</td>" + "".join(
                f"<td>{html.escape(_fmt(cells[k].get(s, '')))}</td>" for s in stages) + "</tr>"
                for k in sorted(cells, key=_rank))
            parts.append(f"<h3>{name}</h3><table class='res stages'>{head}{body}</table>")
        rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(_fmt(v))}</td></tr>"
                       for k, v in _flatten(data) if k != "config")
        if rows:
            parts.append(f"{'' if split else f'<h3>{name}</h3>'}<table class='res'>{rows}</table>")
    return "".join(parts) or "<p>No evaluation results in this run directory.</p>"


def headline_html(run_dir: Path) -> str:
    """The first table of the page: the headline score per stage with its 95% interval. From a result
    file's ``headline`` (``{"metric", "stages": {stage: {value, low, high, n}}}``, ``ludic train env``),
    else the first key result (``KEY_RESULTS``) of per-stage results, with its ``_ci95_low/high`` when
    the run wrote them."""
    for name in RESULT_FILES:
        try:
            data = json.loads((run_dir / name).read_text())
        except (OSError, ValueError):
            continue
        head = data.get("headline") if isinstance(data, dict) else None
        if isinstance(head, dict) and head.get("stages"):
            metric, stages = str(head.get("metric", "score")), head["stages"]
            rows = {st: (v.get("value"), v.get("low"), v.get("high"), v.get("n")) for st, v in stages.items()}
            return _headline_table(metric, rows, data.get("kept"), data.get("instances"), data.get("stopped"))
        split = _stage_columns(data)
        if split is None:
            continue
        flat = {st: dict(_flatten(v)) for st, v in split[0].items()}
        names = sorted({k for v in flat.values() for k in v if "ci95" not in k and isinstance(v[k], (int, float))},
                       key=_rank)
        key = next((k for k in names if _rank(k)[0] < len(KEY_RESULTS)), None)
        if key is None:
            continue
        rows = {st: (v.get(key), v.get(f"{key}_ci95_low"), v.get(f"{key}_ci95_high"), None) for st, v in flat.items()}
        return _headline_table(key, rows, data.get("kept"))
    return ""


def _headline_table(metric: str, rows: dict[str, tuple], kept: Any, instances: Any = None, stopped: Any = None) -> str:
    def pct(x: Any) -> str:
        return f"{x * 100:.1f}%" if isinstance(x, (int, float)) and 0 <= x <= 1 else _fmt(x) if x is not None else ""

    body = "".join(f"<tr><td>{html.escape(st)}</td><td><b>{pct(v)}</b></td><td>"
                   f"{pct(lo) + ' - ' + pct(hi) if lo is not None and hi is not None else ''}</td><td>"
                   f"{'' if n is None else n}</td></tr>" for st, (v, lo, hi, n) in rows.items())
    note = ""
    if isinstance(kept, dict):
        on = (f"{_fmt(kept['value'])} ({kept['note']}); the last step's: {_fmt(kept.get('last_value'))}"
              if "episodes" in kept else
              "this same evaluation (the last step's scores are in the results below)")
        note = (f"<p>Kept weights: step {html.escape(str(kept.get('step')))} of {html.escape(str(kept.get('last_step')))}, "
                f"chosen by {html.escape(str(kept.get('metric')))}: {html.escape(on)}.</p>")
    on = ""
    if isinstance(instances, dict):  # held out means instances (eval.instances): say which these are
        label = str(instances.get("label", ""))
        on = f" on {label}" if label else ""
        warn = " class='warn'" if label != "held out" else ""
        note = (f"<p{warn}><b>{html.escape(label.capitalize())}</b>: {html.escape(str(instances.get('note', '')))}; "
                f"{instances.get('test_trained')} of the {instances.get('test_distinct')} test instances trained on."
                f"</p>") + note
    if isinstance(stopped, dict):
        note += (f"<p>Training stopped at step {html.escape(str(stopped.get('step')))} "
                 f"({html.escape(str(stopped.get('reason')))}): {html.escape(str(stopped.get('message')))}</p>")
    return (f"<h2>Headline: {html.escape(metric)}{html.escape(on)}</h2><table class='res'><tr><th>stage</th><th>"
            f"{html.escape(metric)}</th><th>95% interval</th><th>episodes</th></tr>{body}</table>{note}")


def stage_dirs(run_dir: Path) -> list[Path]:
    """Sub-runs of a multi-stage run (the recipe's sft/ and rl/): folders with their own metrics.jsonl."""
    dirs = [d for d in run_dir.iterdir() if d.is_dir() and (d / "metrics.jsonl").exists()]
    return sorted(dirs, key=lambda d: ((d / "metrics.jsonl").stat().st_mtime, d.name))  # in the order they ran


def _stage_notes(run_dir: Path, stage: str) -> str:
    """What the result files say of a stage: their top-level ``<stage>_*`` scalars (the recipe's rl_steps, rl_stopped)."""
    notes = []
    for name in RESULT_FILES:
        try:
            data = json.loads((run_dir / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            notes += [f"{k} = {_fmt(v)}" for k, v in data.items() if k.startswith(f"{stage}_")
                      and isinstance(v, (str, int, float, bool))]
    return f" {html.escape(', '.join(notes))} (the run's results)." if notes else ""


def stages_html(run_dir: Path, dirs: list[Path]) -> str:
    """Each stage's (``stage_dirs``) learning curves, with a link to its own page; a stage that logged no step says so."""
    parts = []
    for d in dirs:
        rows = _read_jsonl(d / "metrics.jsonl")
        name = html.escape(d.name)
        plots = curves_html(rows, f"{d.name}/") if rows else (
            f"<p>This stage logged no step (its metrics.jsonl is empty).{_stage_notes(run_dir, d.name)} Its episodes, "
            "if it recorded any, are in the trajectory viewer above.</p>")
        parts.append(f"<h2>Stage {name}</h2><p>{len(rows)} rows in {name}/metrics.jsonl; "
                     f"<a href='{name}/report.html'>its own page</a>.</p><div class='plots'>{plots}</div>")
    return "".join(parts)


def pictures_html(run_dir: Path) -> str:
    """``PICTURES`` the run drew, embedded as data URIs (a large one linked)."""
    out = []
    for name in PICTURES:
        path = run_dir / name
        if not path.is_file():
            continue
        src = (f"data:image/png;base64,{base64.b64encode(path.read_bytes()).decode()}"
               if path.stat().st_size <= MAX_PICTURE_BYTES else html.escape(name))
        out.append(f"<figure class='picture'><img src='{src}' alt='{html.escape(name)}'>"
                   f"<figcaption>{html.escape(name)}</figcaption></figure>")
    return "".join(out)


CSS = """
.warn{background:#fff3cd;border:1px solid #e0b400;padding:6px}
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:20px}h2{font-size:17px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:28px}
.plots{display:flex;flex-wrap:wrap;gap:10px}.plot{background:#fafafa;border:1px solid #e3e3e3}
.plot .title{font-size:12px;font-weight:600}.plot .ax{font-size:10px;fill:#666}
.plot .frame{fill:none;stroke:#ddd}.plot .line{fill:none;stroke:#2a6fdb;stroke-width:1.5}
.plot .pt{fill:#2a6fdb}table.res{border-collapse:collapse;font-size:13px}.flat{flex-basis:100%;font-size:13px}
table.res td,table.res th{border:1px solid #e3e3e3;padding:2px 8px}table.res th{background:#f3f3f3}
.picture{margin:0}.picture img{max-width:100%;border:1px solid #e3e3e3}.picture figcaption{font-size:12px;color:#666}
.turn{border-top:1px dashed #ccc;padding:6px 0}.turn-head{font-size:13px;margin-bottom:4px}
.fields{display:flex;gap:12px;font-size:12px}.fields pre{white-space:pre-wrap;max-width:440px;margin:2px 0}
.tokens{font-family:monospace;font-size:12px;white-space:pre-wrap;margin-top:4px;line-height:1.6}
.tok.ctx{color:#888}.tok.trained{background:#ffe58a;color:#000;outline:1px solid #e5c100}
.skip{color:#aaa;font-style:italic}.err{color:#b00}
""" + report_viewer.CSS


def _tokenizer_for(run_dir: Path) -> Any:
    """The run's tokenizer (from config.json's model), or None: the page then shows text only."""
    try:
        model = json.loads((run_dir / "config.json").read_text()).get("model")
        if not model:
            return None
        from ludic.inference.models import load_tokenizer

        return load_tokenizer(model)
    except Exception:
        return None


def minutes_plot(run_dir: Path) -> str:
    """Validation success against minutes (``summary.json``'s ``curve``, ``ludic train env``), the first chart."""
    try:
        curve = json.loads((run_dir / "summary.json").read_text()).get("curve") or []
    except (OSError, ValueError, AttributeError):
        return ""
    points = [(float(p["minutes"]), float(p["success_rate"])) for p in curve if "minutes" in p and "success_rate" in p]
    return svg_plot("validation success vs minutes", points, x_label="min") if points else ""


def build_report(run_dir: str | Path, tokenizer: Any = None) -> Path:
    """Write ``<run_dir>/report.html`` from the run's files; returns its path."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    tok = tokenizer if tokenizer is not None else _tokenizer_for(run_dir)
    rows = _read_jsonl(run_dir / "metrics.jsonl")
    stage_list = stage_dirs(run_dir)
    stages = stages_html(run_dir, stage_list)
    plots = (pictures_html(run_dir) + minutes_plot(run_dir) + curves_html(rows)
             + ("<p>The curves of each stage are below.</p>" if stages else "" if rows else "<p>No metrics.jsonl rows yet.</p>"))
    config = (run_dir / "config.json").read_text() if (run_dir / "config.json").exists() else "{}"
    results = [n for n in RESULT_FILES if (run_dir / n).exists()]
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>Ludic run {html.escape(run_dir.name)}</title><style>{CSS}</style></head><body>"
        f"<h1>Ludic run <code>{html.escape(str(run_dir))}</code></h1>"
        f"<p>{len(rows)} rows in metrics.jsonl{'; stages: ' + ', '.join(d.name for d in stage_list) if stages else ''}; "
        f"rebuild with <code>ludic report {html.escape(str(run_dir))}</code>.</p>"
        f"{headline_html(run_dir)}"
        f"<h2>Learning curves</h2><div class='plots'>{plots}</div>"
        f"{report_viewer.games_html(run_dir)}"
        f"<h2>Sample trajectories</h2>{report_viewer.viewer_html(run_dir, stage_list, tok)}"
        f"<h2>Config</h2><details><summary>config.json</summary><pre>{html.escape(config)}</pre></details>"
        f"<h2>Evaluation</h2><details><summary>every result, per stage{' (' + ', '.join(results) + ')' if results else ''}"
        f"</summary>{result_tables(run_dir)}</details>"
        f"{stages}<script>{report_viewer.SCRIPT}</script>"
        "</body></html>"
    )
    out = run_dir / "report.html"
    tmp = out.with_suffix(".html.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(out)
    return out


class ReportLogger:
    """A metrics sink that (re)writes ``report.html`` when the run's logger closes."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        return None

    def close(self) -> None:
        build_report(self.run_dir)
