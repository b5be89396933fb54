"""The behaviour half of ``report.html``: a trajectory viewer with filters, base and trained side by side, games.

Episodes come from the run directory and its stage folders (``report.stage_dirs``), one *stage* per file:

    rollouts.jsonl        training episodes (stage ``training``; ``rl/training`` for the ``rl/`` folder's)
    eval_*.jsonl          evaluation episodes (stage = the file's name: eval_base, eval_trained, eval_val, ...)
    decisions_*.jsonl     the tic-tac-toe recipe's exact-evaluation decisions: one turn each, a success when the
                          move keeps the game's value (``tictactoe.exact.Decision``; the instance: the board)

``eval_*.jsonl`` of ``ludic train qa`` holds outcome records (question, reply, correct), one turn each.

A rollout row is ``Rollout.to_dict``: its instance is ``meta.reset_info.instance`` (``eval.instances``), else its env
seed; success is ``rollouts.engine.episode_success``. Each episode is drawn once, here, as a
``<details class="ep">`` carrying ``data-stage``, ``data-outcome`` (success / failure), ``data-parse`` and ``data-key``
(the instance); the page's script (``SCRIPT``: plain JS, no library, no network) only hides and shows them, and for the
side by side view clones the first episode of each instance from two stages (eval_base and eval_trained by default).

The page stays small: at most ``MAX_EPISODES`` episodes in all (shared among the files; instances that other files
also hold come first, so pairs survive the cap; training episodes are taken evenly through the file), at most
``MAX_TURNS`` turns each, a long prompt cut to its end and a long reply to its start, and the token view only
for the first training episodes.
The page says how many of how many it shows.

``games.jsonl`` (``tictactoe.showcase``: a stage's games against a bot) is drawn as boards, move by move.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

MAX_EPISODES = 300
"""Episodes embedded in the page, all files together."""
MAX_TURNS = 16
"""Turns shown per episode (the rest are counted)."""
MAX_PROMPT_CHARS, MAX_REPLY_CHARS = 2000, 1500
"""Characters shown of a prompt (its end: the latest observation) and of a reply (its start)."""
TOKEN_VIEWS = 6
"""Training episodes drawn token by token (with the run's tokenizer), to keep the page small."""

_THINK = re.compile(r"^\s*(<think>.*?</think>)(.*)$", re.DOTALL | re.IGNORECASE)
_e = html.escape


def _lines(path: Path) -> list[str]:
    try:
        with path.open() as f:
            return [line for line in f if line.strip()]
    except OSError:
        return []


def _loads(line: str) -> dict | None:
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None  # a line cut by a crash: the rest of the report still renders
    return row if isinstance(row, dict) else None


def sources(run_dir: Path, stage_dirs: list[Path]) -> list[tuple[str, Path]]:
    """(stage, file) of every episode file, training first."""
    out = []
    for d, prefix in [(run_dir, "")] + [(d, f"{d.name}/") for d in stage_dirs]:
        if (d / "rollouts.jsonl").exists():
            out.append((f"{prefix}training", d / "rollouts.jsonl"))
        for pattern in ("eval_*.jsonl", "decisions_*.jsonl"):
            out += [(f"{prefix}{p.stem}", p) for p in sorted(d.glob(pattern))]
    return out


def instance_key(row: dict) -> str:
    """The instance a rollout played: ``meta.reset_info.instance``, else its env seed."""
    meta = row.get("meta") or {}
    inst = (meta.get("reset_info") or {}).get("instance")
    if inst is not None:
        return str(inst)[:500]
    return f"seed {meta['env_seed']}" if meta.get("env_seed") is not None else f"rollout {row.get('id', '?')}"


def _one_turn(stage: str, key: str, prompt: str, reply: str, parsed: Any, ok: bool, parse: bool,
              info: dict[str, Any], failed: bool = False) -> dict[str, Any]:
    turn = {"index": 0, "prev_obs": prompt, "action": reply, "parsed_action": parsed, "reward": None,
            "info": {**info, "parse_error": parse}}
    return {"stage": stage, "key": key, "success": ok, "parse": parse, "failed": failed, "reward": None,
            "steps": [turn], "meta": {}}


def episode(stage: str, row: dict) -> dict[str, Any] | None:
    """One row as the viewer's episode: a rollout (``Rollout.to_dict``), a tic-tac-toe exact-evaluation decision
    (``Decision.to_dict``: its instance is the board) or a QA evaluation record (``recipes.qa``: the question);
    None for a row of another kind."""
    from ludic.rollouts.engine import episode_success

    if "steps" not in row:
        if "board" in row and "completion" in row:
            return _one_turn(stage, f"board {row['board']}", row.get("observation", ""), row.get("completion", ""),
                             row.get("action"), bool(row.get("value_preserving")), row.get("action") is None,
                             {k: row.get(k) for k in ("move", "optimal", "value_preserving")})
        if "reply" in row and "correct" in row:
            key = str(row.get("question") or f"record {row.get('id')}")[:500]
            return _one_turn(stage, key, str(row.get("question") or ""), str(row.get("reply") or ""), row.get("parsed"),
                             bool(row["correct"]), bool(row.get("parse_error")),
                             {k: row.get(k) for k in ("id", "reference", "tool_calls")}, bool(row.get("failed")))
        return None
    steps = [s for s in row.get("steps") or [] if isinstance(s, dict)]
    meta = row.get("meta") or {}
    view = SimpleNamespace(steps=[SimpleNamespace(info=s.get("info") or {}) for s in steps],
                           total_reward=float(row.get("total_reward") or 0.0))
    return {"stage": stage, "key": instance_key(row), "success": episode_success(view) >= 1.0 and not meta.get("failed"),
            "parse": any(s.get("parse_error") or (s.get("info") or {}).get("parse_error") for s in steps),
            "failed": bool(meta.get("failed")), "reward": view.total_reward, "steps": steps, "meta": meta}


def _even(n: int, k: int) -> list[int]:
    """``k`` indices spread evenly over ``range(n)``, the first and the last included."""
    if k >= n:
        return list(range(n))
    return sorted({round(i * (n - 1) / max(k - 1, 1)) for i in range(k)})


def _shares(sizes: list[int], total: int) -> list[int]:
    """Split ``total`` among sources of ``sizes``: small ones take all they have, the rest share what is left."""
    out, left = [0] * len(sizes), total
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    for j, i in enumerate(order):
        out[i] = min(sizes[i], left // (len(order) - j))
        left -= out[i]
    return out


def collect(run_dir: Path, stage_dirs: list[Path], limit: int | None = None) -> tuple[list[dict], int]:
    """(episodes picked for the page, at most ``limit`` (``MAX_EPISODES``); episodes recorded in all): see the
    module's docstring for the picking."""
    limit = MAX_EPISODES if limit is None else limit
    files = [(stage, _lines(path)) for stage, path in sources(run_dir, stage_dirs)]
    evaluated: dict[str, list[dict]] = {}  # evaluation files are small: read whole, to find the instances they share
    for stage, lines in files:
        if not stage.endswith("training"):
            evaluated[stage] = [ep for ep in (episode(stage, r) for r in map(_loads, lines) if r) if ep]
    holders: dict[str, set[str]] = {}
    for stage, eps in evaluated.items():
        for ep in eps:
            holders.setdefault(ep["key"], set()).add(stage)
    picked: list[dict] = []
    for (stage, lines), k in zip(files, _shares([len(x[1]) for x in files], limit)):
        if stage in evaluated:
            order = sorted(range(len(evaluated[stage])), key=lambda i: (-len(holders[evaluated[stage][i]["key"]]), i))
            picked += [evaluated[stage][i] for i in sorted(order[:k])]
        else:  # training: spread through the run, parsed only where picked (rollouts.jsonl can be large)
            rows = (_loads(lines[i]) for i in _even(len(lines), k))
            picked += [ep for ep in (episode(stage, r) for r in rows if r) if ep]
    return picked, sum(len(evaluated[stage]) if stage in evaluated else len(lines) for stage, lines in files)


def _cut(text: str, n: int, tail: bool = False) -> str:
    if text and not text.strip():
        return f'<span class="skip">[only whitespace: {len(text)} characters]</span>'
    if len(text) <= n:
        return _e(text)
    if tail:
        return f'<span class="skip">[{len(text) - n} earlier characters]</span>' + _e(text[-n:])
    return _e(text[:n]) + f'<span class="skip">[{len(text) - n} more characters]</span>'


def _tokens_html(tok: Any, ids: list[int], cls: str, keep_last: int | None = None) -> str:
    shown = ids[-keep_last:] if keep_last and len(ids) > keep_last else ids
    skipped = len(ids) - len(shown)
    head = f'<span class="skip">[{skipped} earlier tokens]</span>' if skipped else ""
    return head + "".join(f'<span class="tok {cls}">{_e(tok.decode([t]))}</span>' for t in shown)


INFO_SHOWN = 8
"""Scalar info entries shown under a turn (answer, reference, score, outcome, ...)."""


def _turn_html(step: dict, tok: Any) -> str:
    action = step.get("action") or ""
    m = _THINK.match(action)
    thinking, answer = (m.group(1), m.group(2)) if m else ("", action)
    info = step.get("info") or {}
    flags = [k for k in ("parse_error", "tool_step", "truncated", "terminated") if step.get(k) or info.get(k)]
    reward = step.get("reward")
    head = (f'<div class="turn-head">turn {step.get("index")}: '
            + (f'reward <b>{reward:.3g}</b>' if isinstance(reward, (int, float)) else "no reward recorded per turn")
            + "".join(f' | <span class="{"flag" if k in ("parse_error", "truncated") else ""}">{k}</span>' for k in flags)
            + f' | parsed: <code>{_cut(str(step.get("parsed_action")), 80)}</code></div>')
    scalars = [(k, v) for k, v in info.items() if k not in flags and isinstance(v, (str, int, float, bool, type(None)))
               and len(str(v)) <= 80][:INFO_SHOWN]
    details = ('<div class="info">' + " ".join(f"<span>{_e(str(k))}=<code>{_e(str(v))}</code></span>" for k, v in scalars)
               + "</div>") if scalars else ""
    text = (f'<div class="fields"><div><b>prompt</b><pre>{_cut(step.get("prev_obs") or "", MAX_PROMPT_CHARS, tail=True)}</pre></div>'
            + (f'<div><b>thinking</b><pre>{_cut(thinking, MAX_REPLY_CHARS)}</pre></div>' if thinking else "")
            + f'<div><b>reply</b><pre>{_cut(answer, MAX_REPLY_CHARS)}</pre></div></div>')
    trace = step.get("trace")
    tokens = ""
    if tok is not None and isinstance(trace, dict) and trace.get("completion_ids"):
        tokens = ('<div class="tokens">' + _tokens_html(tok, trace.get("prompt_ids") or [], "ctx", 120)
                  + _tokens_html(tok, trace["completion_ids"], "trained") + "</div>")
    return f'<div class="turn">{head}{text}{details}{tokens}</div>'


def _outcome(ep: dict) -> str:
    return "success" if ep["success"] else "failure"


def episode_html(ep: dict, tok: Any = None, open_: bool = False) -> str:
    """One episode (``episode``) as a ``<details class="ep">`` with the data the page's filters read."""
    meta, steps = ep["meta"], ep["steps"]
    key = ep["key"]
    badge = "failed" if ep["failed"] else "parse error" if ep["parse"] else _outcome(ep)
    reward = f" | reward {ep['reward']:.3g}" if ep["reward"] is not None else ""
    extra = " | " + _e(str(meta.get("opponent"))) if meta.get("opponent") else ""
    summary = (f'<span class="badge {badge.replace(" ", "-")}">{badge}</span> <b>{_e(ep["stage"])}</b>{reward} | '
               f'{len(steps)} turn{"s" if len(steps) != 1 else ""}{extra} | <span class="key">{_e(key[:90])}'
               f'{"..." if len(key) > 90 else ""}</span>')
    more = (f'<p class="skip">[{len(steps) - MAX_TURNS} more turns]</p>' if len(steps) > MAX_TURNS else "")
    error = f'<p class="err">{_e(str(meta.get("error")))}</p>' if meta.get("error") else ""
    return (f'<details class="ep" data-stage="{_e(ep["stage"])}" data-outcome="{_outcome(ep)}" '
            f'data-parse="{int(ep["parse"])}" data-key="{_e(key)}"{" open" if open_ else ""}><summary>{summary}</summary>'
            f'<button type="button" class="only" data-key="{_e(key)}">only this instance</button>{error}'
            + "".join(_turn_html(s, tok) for s in steps[:MAX_TURNS]) + more + "</details>")


PAIRS = (("base", "trained"), ("base", "rl"), ("base", "sft"), ("before", "after"))
"""The side by side view's default stages: the first stage naming the left word against its twin naming the right."""


def _default_pair(stages: list[str]) -> tuple[str, str]:
    for a, b in PAIRS:
        for left in stages:
            if a in left and left.replace(a, b) in stages:
                return left, left.replace(a, b)
    return (stages[0], stages[-1]) if stages else ("", "")


def _options(stages: list[str], chosen: str) -> str:
    return "".join(f'<option value="{_e(s)}"{" selected" if s == chosen else ""}>{_e(s)}</option>' for s in stages)


def viewer_html(run_dir: Path, stage_dirs: list[Path], tok: Any = None) -> str:
    """The trajectory viewer: filters, the side by side view of two stages, then every picked episode."""
    eps, total = collect(run_dir, stage_dirs)
    if not eps:
        return ("<p>No episodes recorded in this run directory (no rollouts.jsonl, eval_*.jsonl or decisions_*.jsonl, "
                "here or in its stage folders).</p>")
    stages = list(dict.fromkeys(ep["stage"] for ep in eps))
    counts = {s: sum(ep["stage"] == s for ep in eps) for s in stages}
    views, drawn = 0, []
    for i, ep in enumerate(eps):
        use = tok if ep["stage"].endswith("training") and views < TOKEN_VIEWS else None
        views += use is not None
        drawn.append(episode_html(ep, use, open_=i < 2))
    opts = "".join(f'<option value="{_e(s)}">{_e(s)} ({counts[s]})</option>' for s in stages)
    left, right = _default_pair(stages)
    keys = "".join(f'<option value="{_e(k)}">' for k in dict.fromkeys(ep["key"][:200] for ep in eps))
    note = (f"{len(eps)} of the {total} episodes this run recorded" + (
        f" (at most {MAX_EPISODES} are embedded, shared among the files; training episodes taken evenly "
        "through the run)" if len(eps) < total else "") + ", at most "
        f"{MAX_TURNS} turns each. Instance: <code>meta.reset_info.instance</code>, else the env seed.")
    tokens = ("<p><span class='tok trained'>highlighted</span> tokens were sampled and carry the training weight; "
              "<span class='tok ctx'>grey</span> ones are context (prompt, env, tool and template text), masked out of "
              f"the loss (the first {TOKEN_VIEWS} training episodes).</p>") if views else ""
    return (
        f"<p>{note}</p>{tokens}"
        "<h3>Side by side on the same instance</h3><div id='pair-controls' class='controls'>"
        f"<label>left <select id='p-left'>{_options(stages, left)}</select></label> "
        f"<label>right <select id='p-right'>{_options(stages, right)}</select></label> "
        "<label><input type='checkbox' id='p-changed'> only where the outcome differs</label> "
        "<span id='p-count'></span></div><div id='pairs'></div>"
        "<h3>Episodes</h3><div id='filters' class='controls'>"
        "<label>outcome <select id='f-outcome'><option value='all'>all</option><option value='success'>success</option>"
        "<option value='failure'>failure</option><option value='parse_error'>parse error</option></select></label> "
        f"<label>stage <select id='f-stage'><option value=''>all</option>{opts}</select></label> "
        f"<label>instance <input id='f-instance' list='f-keys' size='40' placeholder='contains...'></label>"
        f"<datalist id='f-keys'>{keys}</datalist> <button type='button' id='f-clear'>clear</button> "
        f"<span id='f-count'></span></div><div id='episodes'>{''.join(drawn)}</div>"
    )


SCRIPT = """
(function () {
  var $ = function (id) { return document.getElementById(id); };
  var box = $('episodes');
  if (!box) return;
  var eps = Array.prototype.slice.call(box.children);
  function filter() {
    var o = $('f-outcome').value, st = $('f-stage').value, q = $('f-instance').value.trim().toLowerCase(), n = 0;
    eps.forEach(function (e) {
      var d = e.dataset;
      var ok = (!st || d.stage === st) && (!q || d.key.toLowerCase().indexOf(q) >= 0) &&
        (o === 'all' || (o === 'parse_error' ? d.parse === '1' : d.outcome === o));
      e.hidden = !ok;
      if (ok) n++;
    });
    $('f-count').textContent = n + ' of ' + eps.length + ' episodes shown';
  }
  function firstByKey(stage) {
    var m = new Map();
    eps.forEach(function (e) { if (e.dataset.stage === stage && !m.has(e.dataset.key)) m.set(e.dataset.key, e); });
    return m;
  }
  function pairs() {
    var a = firstByKey($('p-left').value), b = firstByKey($('p-right').value), only = $('p-changed').checked;
    var out = $('pairs'), n = 0, shown = 0;
    out.textContent = '';
    a.forEach(function (l, key) {
      var r = b.get(key);
      if (!r) return;
      n++;
      if (only && l.dataset.outcome === r.dataset.outcome) return;
      var row = document.createElement('div');
      row.className = 'pair';
      row.dataset.key = key;
      [l, r].forEach(function (e) { var c = e.cloneNode(true); c.hidden = false; c.open = shown < 4; row.appendChild(c); });
      out.appendChild(row);
      shown++;
    });
    $('p-count').textContent = n ? shown + ' of the ' + n + ' instances both stages played' :
      'no instance played in both stages';
  }
  $('filters').addEventListener('input', filter);
  $('filters').addEventListener('change', filter);
  $('pair-controls').addEventListener('change', pairs);
  $('f-clear').addEventListener('click', function () {
    $('f-outcome').value = 'all'; $('f-stage').value = ''; $('f-instance').value = ''; filter();
  });
  document.addEventListener('click', function (ev) {
    var b = ev.target.closest('button.only');
    if (!b) return;
    $('f-instance').value = b.dataset.key; $('f-stage').value = ''; filter();
    $('filters').scrollIntoView();
  });
  filter();
  pairs();
})();
"""
"""Filters and the side by side view (plain JS, run once the page has loaded)."""


def games_html(run_dir: Path) -> str:
    """``games.jsonl`` as boards, move by move, the policy's reply under each of its moves; the last stage's open."""
    rows = [r for r in map(_loads, _lines(run_dir / "games.jsonl")) if r and r.get("moves")]
    if not rows:
        return ""
    stages = list(dict.fromkeys(str(g.get("stage", "")) for g in rows))
    parts = []
    for stage in reversed(stages):  # the final policy first
        games = "".join(_game_html(g) for g in rows if str(g.get("stage", "")) == stage)
        parts.append(f"<details class='games'{' open' if stage == stages[-1] else ''}><summary>{_e(stage)}: "
                     f"{sum(str(g.get('stage', '')) == stage for g in rows)} games</summary>{games}</details>")
    return ("<h2>Games</h2><p>Greedy games against the opponent in both seats (games.jsonl), replayed from the "
            "exact evaluation's recorded decisions; the last stage (the final policy) first. A marked cell is the "
            "move just played.</p>" + "".join(parts))


def _game_html(g: dict) -> str:
    boards, prev = [], None
    for i, m in enumerate(g["moves"]):
        rows = [str(r) for r in m.get("board") or []]
        cells = "".join("<tr>" + "".join(
            f"<td class='{'new' if prev and prev[y][x] != c else ''}'>{'' if c == '.' else _e(c)}</td>"
            for x, c in enumerate(row)) + "</tr>" for y, row in enumerate(rows))
        prev = rows
        who = "policy" if m.get("player") == "policy" else _e(str(m.get("player")))
        note = m.get("note") or ("" if m.get("player") != "policy" else
                                 "keeps the value" if m.get("value_preserving") else "gives value away")
        reply = f"<pre>{_cut(str(m.get('reply', '')), 80)}</pre>" if m.get("player") == "policy" else ""
        boards.append(f"<figure class='move {'policy' if who == 'policy' else ''}'><table class='board'>{cells}</table>"
                      f"<figcaption>{i + 1}. {_e(str(m.get('mark')))} {who}: <b>{_e(str(m.get('cell') or '-'))}</b>"
                      f"{'<br>' + _e(note) if note else ''}</figcaption>{reply}</figure>")
    return (f"<div class='game' data-outcome='{_e(str(g.get('outcome')))}'><div class='game-head'>policy as "
            f"<b>{_e(str(g.get('seat')))}</b> against {_e(str(g.get('opponent')))} (tie-break seed {_e(str(g.get('seed')))}): "
            f"<b>{_e(str(g.get('outcome')))}</b></div><div class='moves'>{''.join(boards)}</div></div>")


CSS = """
.controls{font-size:13px;margin:6px 0;display:flex;gap:10px;flex-wrap:wrap;align-items:center}
.ep{margin:6px 0;border:1px solid #ddd;padding:4px 6px;background:#fff}.ep>summary{cursor:pointer;font-size:13px}
.ep .key{color:#555}.only{font-size:11px;margin:4px 0}.badge{font-size:11px;padding:1px 5px;border-radius:3px;color:#fff}
.badge.success{background:#2e8b57}.badge.failure{background:#b03a2e}.badge.parse-error{background:#8e44ad}
.badge.failed{background:#555}.pair{display:grid;grid-template-columns:1fr 1fr;gap:8px;border-bottom:2px solid #eee}
.pair .fields{flex-direction:column}.fields pre{max-height:18em;overflow:auto}.info{font-size:11px;color:#555;display:flex;gap:8px;flex-wrap:wrap}
.flag{color:#8e44ad}.games{margin:6px 0}.game{margin:8px 0;border:1px solid #ddd;padding:6px}
.game-head{font-size:13px;margin-bottom:4px}.moves{display:flex;flex-wrap:wrap;gap:8px}
.move{margin:0;font-size:11px;width:96px}.move pre{margin:2px 0;white-space:pre-wrap;color:#555}
table.board{border-collapse:collapse}table.board td{border:1px solid #999;width:22px;height:22px;text-align:center;
font:bold 14px monospace}table.board td.new{background:#ffe58a}.move.policy figcaption{color:#1a4fa0}
"""
