"""Synthetic data (teacher + rejection-sampling conversion), SFT records and the offline source."""

import asyncio
import json

import pytest

from ludic.data.offline import OfflineBatchSource, load_sft_items, sft_item
from ludic.tictactoe.synth import (
    episode_records,
    filter_rollouts,
    keep_results,
    move_kind,
    rollouts_to_records,
    teacher_episodes,
    teacher_records,
)
from ludic.tictactoe import board as ttt
from ludic.tokenization import render_ids
from ludic.types import Rollout, Step


def _b(s):
    return tuple(" " if c == "." else c for c in s)


def test_move_kinds():
    assert move_kind(_b("XX.OO...."), 2) == "win"
    assert move_kind(_b("OO.X....X"), 2) == "block"  # X to move; O threatens the top row
    assert move_kind(_b("X.......O"), 4) == "centre"


def test_teacher_never_loses_and_records_match_episodes():
    eps = teacher_episodes(60, seed=1)
    assert {m["result"] for _, m in eps} <= {"win", "draw"}
    assert {m["opponent"] for _, m in eps} == {"random", "mixed", "minimax"}
    assert {m["agent_mark"] for _, m in eps} == {"X", "O"}
    for turns, _ in eps:
        for obs, reply in turns:
            assert reply.startswith("<think>") and "</think><move>" in reply and reply.endswith("</move>")
    recs = teacher_records(60, "SYS", keep=("win",), seed=1)
    assert recs and all(r["meta"]["result"] == "win" for r in recs)


def test_episode_records_transform_and_views():
    turns = [("obs1", "<think>long a</think><move>A1</move>"), ("obs2", "<think>long b</think><move>B2</move>")]
    full = episode_records("SYS", turns, transform=False)
    trunc = episode_records("SYS", turns)
    last = episode_records("SYS", turns, ctx="last")
    assert full[1]["messages"][2]["content"] == turns[0][1]
    assert trunc[1]["messages"][2]["content"] == "<think>[TRUNCATED]</think><move>A1</move>"
    assert trunc[1]["completion"] == turns[1][1]  # the trained reply is kept intact
    assert [m["content"] for m in last[1]["messages"]] == ["SYS", "obs2"]


def test_rejection_sampling_filter_and_conversion():
    def r(result, actions):
        steps = [Step(i, f"o{i}", a, a, None, 0.0, info={"result": result} if i == len(actions) - 1 else {})
                 for i, a in enumerate(actions)]
        return Rollout(steps=steps, meta={"env_seed": 1})

    kept = filter_rollouts([r("win", ["a", "b"]), r("loss", ["c"]), r("draw", ["d"])], keep_results("win"))
    assert len(kept) == 1
    recs = rollouts_to_records(kept, "SYS", transform=False)
    assert [x["completion"] for x in recs] == ["a", "b"]
    assert [m["content"] for m in recs[1]["messages"]] == ["SYS", "o0", "a", "o1"]


def test_sft_items_mask_only_completion(tokenizer, tmp_path):
    rec = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], "completion": "C1"}
    it = sft_item(rec, tokenizer)
    assert list(it.prompt_ids) == render_ids(tokenizer, rec["messages"])
    assert it.completion_ids[-1] == tokenizer.eos_token_id and it.weight == 1.0
    raw = sft_item({"prompt": "board", "completion": "<|move|>"}, tokenizer, chat=False)
    assert tokenizer.decode(raw.completion_ids) == "<|move|>"
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(rec) + "\n" + json.dumps({"completion": 3}) + "\n")
    with pytest.raises(ValueError, match=r"d.jsonl:2"):
        load_sft_items(str(path), tokenizer)


def test_offline_source_shards_epochs_and_resumes():
    from ludic.types import SAWItem

    items = [SAWItem((i,), (i,), 1.0) for i in range(10)]
    a = OfflineBatchSource(items, 3, seed=0, rank=0, world_size=2)
    b = OfflineBatchSource(items, 3, seed=0, rank=1, world_size=2)
    first_a = asyncio.run(a.next_batch()).items + asyncio.run(a.next_batch()).items
    first_b = asyncio.run(b.next_batch()).items + asyncio.run(b.next_batch()).items
    assert {x.prompt_ids for x in first_a}.isdisjoint({x.prompt_ids for x in first_b})
    assert len(first_a) + len(first_b) == 10
    state = a.state_dict()
    nxt = asyncio.run(a.next_batch()).items
    c = OfflineBatchSource(items, 3, seed=0, rank=0, world_size=2)
    c.load_state_dict(state)
    assert asyncio.run(c.next_batch()).items == nxt and a.epoch == 1


def test_teacher_positions_cover_every_reachable_decision_and_never_lose():
    from ludic.tictactoe.synth import preferred_best_move, teacher_position_records, teacher_positions

    boards = set(teacher_positions())
    assert len(boards) == 335
    # play the deterministic teacher against every opponent line, from both seats: it meets only
    # positions in the set and never loses
    def walk(board, me):
        if ttt.is_over(board):
            assert ttt.winner(board) != ttt.other(me)
            return
        if ttt.to_move(board) == me:
            assert board in boards
            walk(ttt.play(board, preferred_best_move(board)), me)
        else:
            for m in ttt.legal_moves(board):
                walk(ttt.play(board, m), me)

    walk(ttt.EMPTY_BOARD, "X")
    walk(ttt.EMPTY_BOARD, "O")
    recs = teacher_position_records("SYS")
    assert recs[0]["completion"] == "<think>Take the centre.</think><move>B2</move>"
    assert all(r["messages"][1]["content"].endswith("Your move.") for r in recs)
    short = teacher_position_records(None, style="kind", show_moves=False)
    assert short[0]["messages"] == [{"role": "user", "content": "Board:\n" + ttt.render_board(ttt.EMPTY_BOARD, True)
                                     + "\nYou are X. Your move."}]
    assert short[0]["completion"] == "<think>centre</think><move>B2</move>"
    assert teacher_position_records("S", style="move")[0]["completion"] == "<move>B2</move>"
    assert teacher_position_records("S", style="cell")[0]["completion"] == "B2"
    with pytest.raises(ValueError, match="answer style"):
        teacher_position_records("S", style="essay")
