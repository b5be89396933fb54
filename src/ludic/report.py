"""Run reports: one self-contained ``report.html`` per run directory, rebuilt from its JSONL files.

    ludic report runs/qa-20261123-1200            (re)write runs/.../report.html

What the page shows, in this order, from the files a run writes: the headline score per stage with
its 95% interval, the learning curves, sample trajectories, the config, then every result (folded):
    ``metrics.jsonl``   learning curves (reward, success, loss, KL, entropy, clip fraction, lengths,
                        stale share, ... every numeric series that varies), one inline SVG each,
                        one point per row that carries the metric
    ``*.json`` results  evaluation tables (``report.json``, ``qa_results.json``, ``summary.json``)
    ``rollouts.jsonl``  sample trajectories, turn by turn: prompt, thinking, action, reward; with a
                        tokenizer, every token is shown and the trained (sampled) ones are marked

No scripts, fonts or images are fetched: the file opens offline and can be mailed.
Every recipe's logger writes it when the run ends (``ReportLogger``).
"""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path
from typing import Any, Iterable

CURVES = (
    "reward_mean", "success_rate", "score", "win_rate", "draw_rate", "loss_rate", "accuracy", "correct_rate",
    "loss", "policy_loss", "value_loss", "kl", "kl_loss", "sampler_kl", "entropy", "clip_frac",
    "completion_tokens_mean", "sequence_tokens_per_episode", "stale_dropped", "stale_share",
    "parse_error_rate", "invalid_answer_rate", "illegal_rate", "grad_norm", "lr", "step_s",
)
"""Plotted first, in this order; other varying numeric series follow."""
SKIP = {"step", "time"}
RESULT_FILES = ("report.json", "qa_results.json", "tinker_results.json", "summary.json")
MAX_TRAJECTORIES = 6


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


def series(rows: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """``{metric: [(step, value), ...]}`` for every finite numeric metric, CURVES first."""
    out: dict[str, list[tuple[float, float]]] = {}
    for i, r in enumerate(rows):
        x = float(r.get("step", i))
        for k, v in r.items():
            if k in SKIP or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            out.setdefault(k, []).append((x, float(v)))
    first = [k for k in CURVES if k in out]
    rest = sorted(k for k in out if k not in CURVES and len({v for _, v in out[k]}) > 1)
    return {k: out[k] for k in first + rest}


def svg_plot(name: str, points: list[tuple[float, float]], w: int = 320, h: int = 170) -> str:
    """A line plot with one ``<circle class="pt">`` per point, its axes' ranges as labels."""
    pad_l, pad_r, pad_t, pad_b = 46, 10, 22, 22
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - 1, y1 + 1

    def px(x: float) -> float:
        return pad_l + (x - x0) / (x1 - x0) * (w - pad_l - pad_r)

    def py(y: float) -> float:
        return h - pad_b - (y - y0) / (y1 - y0) * (h - pad_t - pad_b)

    coords = [(px(x), py(y)) for x, y in points]
    line = " ".join(f"{a:.1f},{b:.1f}" for a, b in coords)
    dots = "".join(f'<circle class="pt" cx="{a:.1f}" cy="{b:.1f}" r="2.2"><title>step {x:g}: {y:.4g}</title></circle>'
                   for (a, b), (x, y) in zip(coords, points))
    label = html.escape(name)
    return (
        f'<svg class="plot" data-metric="{label}" data-points="{len(points)}" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" xmlns="http://www.w3.org/2000/svg">'
        f'<text x="{pad_l}" y="14" class="title">{label}</text>'
        f'<rect x="{pad_l}" y="{pad_t}" width="{w - pad_l - pad_r}" height="{h - pad_t - pad_b}" class="frame"/>'
        f'<text x="{pad_l - 4}" y="{pad_t + 8}" class="ax" text-anchor="end">{y1:.3g}</text>'
        f'<text x="{pad_l - 4}" y="{h - pad_b}" class="ax" text-anchor="end">{y0:.3g}</text>'
        f'<text x="{pad_l}" y="{h - 6}" class="ax">{x0:g}</text>'
        f'<text x="{w - pad_r}" y="{h - 6}" class="ax" text-anchor="end">step {x1:g}</text>'
        f'<polyline points="{line}" class="line"/>{dots}</svg>'
    )


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


_THINK = re.compile(r"^\s*(<think>.*?</think>)(.*)$", re.DOTALL | re.IGNORECASE)


def _tokens_html(tok: Any, ids: list[int], cls: str, keep_last: int | None = None) -> str:
    shown = ids[-keep_last:] if keep_last and len(ids) > keep_last else ids
    skipped = len(ids) - len(shown)
    head = f'<span class="skip">[{skipped} earlier tokens]</span>' if skipped else ""
    return head + "".join(f'<span class="tok {cls}">{html.escape(tok.decode([t]))}</span>' for t in shown)


def _step_html(step: dict, tok: Any) -> str:
    action = step.get("action") or ""
    m = _THINK.match(action)
    thinking, answer = (m.group(1), m.group(2)) if m else ("", action)
    flags = [k for k in ("parse_error", "tool_step", "truncated", "terminated")
             if step.get(k) or step.get("info", {}).get(k)]
    head = (f'<div class="turn-head">turn {step.get("index")}: reward <b>{step.get("reward", 0):.3g}</b>'
            f'{" | " + ", ".join(flags) if flags else ""}'
            f' | parsed: <code>{html.escape(str(step.get("parsed_action")))}</code></div>')
    trace = step.get("trace")
    if tok is not None and trace:
        body = ('<div class="tokens">' + _tokens_html(tok, trace["prompt_ids"], "ctx", 120)
                + _tokens_html(tok, trace["completion_ids"], "trained") + "</div>")
    else:
        body = (f'<div class="tokens"><span class="tok ctx">{html.escape(step.get("prev_obs") or "")}</span>'
                f'<span class="tok trained">{html.escape(action)}</span></div>')
    text = (f'<div class="fields"><div><b>prompt</b><pre>{html.escape(step.get("prev_obs") or "")}</pre></div>'
            + (f'<div><b>thinking</b><pre>{html.escape(thinking)}</pre></div>' if thinking else "")
            + f'<div><b>action</b><pre>{html.escape(answer)}</pre></div></div>')
    return f'<div class="turn">{head}{text}{body}</div>'


def stage_dirs(run_dir: Path) -> list[Path]:
    """Sub-runs of a multi-stage run (the recipe's sft/ and rl/): folders with their own metrics.jsonl."""
    dirs = [d for d in run_dir.iterdir() if d.is_dir() and (d / "metrics.jsonl").exists()]
    return sorted(dirs, key=lambda d: ((d / "metrics.jsonl").stat().st_mtime, d.name))  # in the order they ran


def stages_html(run_dir: Path) -> str:
    """Each stage's learning curves, with a link to its own page."""
    parts = []
    for d in stage_dirs(run_dir):
        rows = _read_jsonl(d / "metrics.jsonl")
        plots = "".join(svg_plot(f"{d.name}/{k}", v) for k, v in series(rows).items())
        parts.append(f"<h2>Stage {html.escape(d.name)}</h2><p>{len(rows)} rows in {html.escape(d.name)}/metrics.jsonl; "
                     f"<a href='{html.escape(d.name)}/report.html'>its own page</a>.</p><div class='plots'>{plots}</div>")
    return "".join(parts)


def trajectories(run_dir: Path, tok: Any = None) -> str:
    path = run_dir / "rollouts.jsonl"
    if not path.exists():  # a multi-stage run: the last stage that sampled
        path = next((d / "rollouts.jsonl" for d in reversed(stage_dirs(run_dir)) if (d / "rollouts.jsonl").exists()), path)
    rows = _read_jsonl(path)
    if not rows:
        return "<p>No rollouts.jsonl in this run directory.</p>"
    picked = rows[:MAX_TRAJECTORIES // 2] + rows[-(MAX_TRAJECTORIES - MAX_TRAJECTORIES // 2):] \
        if len(rows) > MAX_TRAJECTORIES else rows
    out = []
    for r in picked:
        meta = r.get("meta", {})
        title = (f'rollout {html.escape(str(r.get("id", ""))[:8])} | agent {html.escape(str(meta.get("agent_id")))}'
                 f' | {html.escape(str(meta.get("env_kind", "")))} | total reward {r.get("total_reward", 0):.3g}'
                 f'{" | FAILED: " + html.escape(str(meta.get("error"))) if meta.get("failed") else ""}')
        steps = "".join(_step_html(s, tok) for s in r.get("steps", [])[:12])
        out.append(f'<details class="traj" open><summary>{title}</summary>{steps}</details>')
    return (f"<p>{len(picked)} of {len(rows)} rollouts (the first and the last). "
            "<span class='tok trained'>highlighted</span> tokens were sampled and carry the training weight; "
            "<span class='tok ctx'>grey</span> ones are context (prompt, env, tool and template text), "
            "masked out of the loss.</p>" + "".join(out))


CSS = """
.warn{background:#fff3cd;border:1px solid #e0b400;padding:6px}
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:20px}h2{font-size:17px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:28px}
.plots{display:flex;flex-wrap:wrap;gap:10px}.plot{background:#fafafa;border:1px solid #e3e3e3}
.plot .title{font-size:12px;font-weight:600}.plot .ax{font-size:10px;fill:#666}
.plot .frame{fill:none;stroke:#ddd}.plot .line{fill:none;stroke:#2a6fdb;stroke-width:1.5}
.plot .pt{fill:#2a6fdb}table.res{border-collapse:collapse;font-size:13px}
table.res td,table.res th{border:1px solid #e3e3e3;padding:2px 8px}table.res th{background:#f3f3f3}.traj{margin:8px 0;border:1px solid #ddd;padding:6px}
.turn{border-top:1px dashed #ccc;padding:6px 0}.turn-head{font-size:13px;margin-bottom:4px}
.fields{display:flex;gap:12px;font-size:12px}.fields pre{white-space:pre-wrap;max-width:440px;margin:2px 0}
.tokens{font-family:monospace;font-size:12px;white-space:pre-wrap;margin-top:4px;line-height:1.6}
.tok.ctx{color:#888}.tok.trained{background:#ffe58a;color:#000;outline:1px solid #e5c100}
.skip{color:#aaa;font-style:italic}.err{color:#b00}
"""


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
    return svg_plot("validation success vs minutes", points) if points else ""


def build_report(run_dir: str | Path, tokenizer: Any = None) -> Path:
    """Write ``<run_dir>/report.html`` from the run's files; returns its path."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    tok = tokenizer if tokenizer is not None else _tokenizer_for(run_dir)
    rows = _read_jsonl(run_dir / "metrics.jsonl")
    curves = series(rows)
    stages = stages_html(run_dir)
    plots = minutes_plot(run_dir) + "".join(svg_plot(k, v) for k, v in curves.items()) or (
        "<p>The curves are per stage, below.</p>" if stages else "<p>No metrics.jsonl rows yet.</p>")
    config = (run_dir / "config.json").read_text() if (run_dir / "config.json").exists() else "{}"
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>Ludic run {html.escape(run_dir.name)}</title><style>{CSS}</style></head><body>"
        f"<h1>Ludic run <code>{html.escape(str(run_dir))}</code></h1>"
        f"<p>{len(rows)} rows in metrics.jsonl{'; stages: ' + ', '.join(d.name for d in stage_dirs(run_dir)) if stages else ''}; "
        f"rebuild with <code>ludic report {html.escape(str(run_dir))}</code>.</p>"
        f"{headline_html(run_dir)}"
        f"<h2>Learning curves</h2><div class='plots'>{plots}</div>"
        f"<h2>Sample trajectories</h2>{trajectories(run_dir, tok)}"
        f"<h2>Config</h2><details><summary>config.json</summary><pre>{html.escape(config)}</pre></details>"
        f"<h2>Evaluation</h2><details><summary>every result, per stage"
        f"{' (' + ', '.join(n for n in RESULT_FILES if (run_dir / n).exists()) + ')' if any((run_dir / n).exists() for n in RESULT_FILES) else ''}"
        f"</summary>{result_tables(run_dir)}</details>"
        f"{stages}"
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
