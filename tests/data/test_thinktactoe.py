"""ThinkTacToe datasets: text dialects, generator schemas, solver labels, readers, reward, CLI."""

from __future__ import annotations

import json
import random
import re

import pytest

from ludic.data.jsonl import DatasetError, write_jsonl
from ludic.tictactoe.thinktactoe import (
    BOARD_END,
    MOVE_PREFIX,
    NUM_POSITIONS,
    THINK_CLOSE,
    THINK_OPEN,
    all_positions,
    board_block,
    main,
    make_dpo_records,
    make_grpo_records,
    make_minimax_records,
    make_prompt,
    make_sft_records,
    move_kind,
    move_quality,
    move_quality_reward,
    move_text,
    parse_board_block,
    parse_move,
    parse_side,
    read_dpo,
    read_grpo,
    read_minimax,
    read_sft,
    think_text,
)
from ludic.tictactoe.board import EMPTY_BOARD, best_moves, legal_moves, play, solve, to_move, winner


def board(*rows: str):
    """board("X.O", ".O.", "X..") -> a 9-tuple ('.' = empty)."""
    cells = "".join(rows).replace(".", " ")
    assert len(cells) == 9
    return tuple(cells)


def sign(v):
    return (v > 0) - (v < 0)


def immediate_wins(b):
    return [m for m in legal_moves(b) if winner(play(b, m)) is not None]


def split_text(text):
    """(board, side, thought or None, move) of an SFT / minimax text."""
    b = parse_board_block(text)
    rest = text.split(BOARD_END + "\n", 1)[1]
    thought = re.search(r"<player_think>(.*)</player_think>\n", rest)
    return b, parse_side(text), thought and thought.group(1), parse_move(rest)


# ---------------------------------------------------------------- text format


def test_board_block_exact_format():
    b = board("XO.", "...", "..X")
    assert board_block(b) == (
        "<|board_start|>\n"
        "<|0-0|><|X|> <|0-1|><|O|> <|0-2|><|blank|>\n"
        "<|1-0|><|blank|> <|1-1|><|blank|> <|1-2|><|blank|>\n"
        "<|2-0|><|blank|> <|2-1|><|blank|> <|2-2|><|X|>\n"
        "<|board_end|>"
    )
    assert make_prompt(b, "player") == board_block(b) + "\n<|player|>O\n"
    assert make_prompt(b, "minimax") == board_block(b) + "\n<|turn|>player\n<|symbol|>O\n"
    assert make_prompt(EMPTY_BOARD, "minimax").endswith("<|turn|>bot\n<|symbol|>X\n")
    with pytest.raises(ValueError):
        make_prompt(b, "chat")


def test_parse_board_round_trip_and_leniency():
    for b in all_positions()[::37]:
        assert parse_board_block("junk before " + board_block(b) + "\n<|player|>X") == b
    b = board("XO.", "...", "..X")
    rows = board_block(b).split("\n")[1:4]
    # blank lines between the markers and a missing cell (stays empty) are tolerated
    last = rows[2].replace("<|2-2|><|X|>", "")
    loose = "<|board_start|>\n\n" + rows[0] + "\n  \n" + rows[1] + "\n" + last + "\n<|board_end|>"
    assert parse_board_block(loose) == board("XO.", "...", "...")
    assert parse_board_block("no board here") is None
    assert parse_board_block("<|board_start|>\n" + rows[0] + "\n<|board_end|>") is None  # < 3 rows
    assert parse_board_block(board_block(b).replace("<|2-2|>", "<|3-2|>")) is None
    assert parse_board_block(board_block(b).replace("<|board_end|>", "")) is None


def test_parse_move_forms():
    for i in range(9):
        assert parse_move(move_text(i)) == i
        assert parse_move(move_text(i)[len(MOVE_PREFIX):]) == i  # after the forced prefix
    assert move_text(5) == "<|move|><|1-2|><|end|>"
    assert parse_move("<player_think>take 0-0?</player_think>\n<|move|><|2-1|><|end|>") == 7
    assert parse_move(" 1-1|><|end|> trailing") == 4
    assert parse_move("I think 1-1|><|end|>") is None  # bare form only at the start
    assert parse_move("<|move|><|3-1|><|end|>") is None  # digits 0-2 only
    assert parse_move("<|move|><|1-1|>") is None
    assert parse_move("") is None


def test_thought_templates_match_move_kind():
    rng = random.Random(0)
    b = board(".XX", "...", "OO.")  # X to move: 0 wins (top row), 8 blocks (bottom row)
    assert move_kind(b, 0) == "win" and move_kind(b, 8) == "block"
    assert move_kind(b, 4) == "centre" and move_kind(b, 3) == "edge" and move_kind(EMPTY_BOARD, 2) == "corner"
    win, block = think_text(b, 0, rng), think_text(b, 8, rng)
    assert win.startswith(THINK_OPEN) and win.endswith(THINK_CLOSE)
    assert "0-0" in win and "top row" in win
    assert "2-2" in block and "bottom row" in block and "O" in block


# ---------------------------------------------------------------- generators


def test_sft_template_schema():
    records = make_sft_records(300, think="template", seed=1)
    assert len(records) == 300
    boards, sides = set(), set()
    for r in records:
        assert set(r) == {"text"} and isinstance(r["text"], str)
        b, side, thought, move = split_text(r["text"])
        assert b is not None and winner(b) is None and legal_moves(b)
        assert side == to_move(b)
        assert r["text"].startswith(make_prompt(b, "player"))
        assert thought and r["text"].endswith(f"{THINK_CLOSE}\n{move_text(move)}")
        assert move in best_moves(b)
        boards.add(b)
        sides.add(side)
    assert len(boards) == 300  # deduplicated
    assert sides == {"X", "O"}


def test_sft_nothink_schema_and_minimax_style():
    for r in make_sft_records(100, think="none", seed=2):
        b, side, thought, move = split_text(r["text"])
        assert thought is None and THINK_OPEN not in r["text"]
        assert r["text"] == make_prompt(b, "player") + move_text(move)
    for r in make_sft_records(20, think="none", seed=2, prompt_style="minimax"):
        b = parse_board_block(r["text"])
        assert "<|turn|>" in r["text"] and parse_side(r["text"]) == to_move(b)
    with pytest.raises(ValueError):
        make_sft_records(5, think="llm")
    with pytest.raises(ValueError, match="4520"):
        make_sft_records(NUM_POSITIONS + 1)


@pytest.mark.parametrize("think", ["template", "none"])
def test_dpo_schema_rejected_strictly_worse(think):
    records = make_dpo_records(300, think=think, seed=3)
    assert len(records) == 300
    sides, flips = set(), 0
    for r in records:
        assert set(r) == {"prompt", "chosen", "rejected"} and all(isinstance(v, str) for v in r.values())
        b = parse_board_block(r["prompt"])
        assert r["prompt"] == make_prompt(b, "player") and r["prompt"].endswith("\n")
        sides.add(parse_side(r["prompt"]))
        chosen, rejected = parse_move(r["chosen"]), parse_move(r["rejected"])
        assert chosen != rejected and chosen in best_moves(b) and b[rejected] == " "
        scores = solve(b)
        assert scores[rejected] < scores[chosen]
        can_flip = any(sign(s) != sign(scores[chosen]) for s in scores.values())
        assert sign(scores[rejected]) != sign(scores[chosen]) or not can_flip  # outcome change preferred
        flips += sign(scores[rejected]) != sign(scores[chosen])
        for answer in (r["chosen"], r["rejected"]):
            assert (THINK_OPEN in answer) == (think == "template")
            assert answer.endswith(move_text(parse_move(answer)))
    assert sides == {"X", "O"} and flips > 150


@pytest.mark.parametrize("style", ["minimax", "player"])
def test_grpo_schema(style):
    records = make_grpo_records(200, seed=4, prompt_style=style)
    sides = set()
    for r in records:
        assert set(r) == {"prompt", "completion"}
        b = parse_board_block(r["prompt"])
        sides.add(parse_side(r["prompt"]))
        assert parse_side(r["prompt"]) == to_move(b)
        if style == "minimax":
            assert r["prompt"] == make_prompt(b, "minimax") + "<|move|><|"
            assert r["prompt"].endswith("\n<|move|><|")
            assert re.fullmatch(r"[0-2]-[0-2]\|><\|end\|>", r["completion"])
        else:
            assert r["prompt"] == make_prompt(b, "player")
            assert re.fullmatch(r"<\|move\|><\|[0-2]-[0-2]\|><\|end\|>", r["completion"])
        assert parse_move(r["completion"]) in best_moves(b)
        assert parse_move(r["prompt"] + r["completion"]) == parse_move(r["completion"])
        assert move_quality_reward(r["prompt"], r["completion"]) > 0
    assert sides == {"X", "O"}


def test_generators_are_deterministic_per_seed():
    assert make_sft_records(50, seed=7) == make_sft_records(50, seed=7)
    assert make_sft_records(50, seed=7) != make_sft_records(50, seed=8)
    assert make_dpo_records(50, "template", 7) == make_dpo_records(50, "template", 7)
    assert make_dpo_records(50, "template", 7) != make_dpo_records(50, "template", 8)
    assert make_grpo_records(50, 7) == make_grpo_records(50, 7)
    assert make_grpo_records(50, 7) != make_grpo_records(50, 8)
    assert make_minimax_records(0) == make_minimax_records(0)


def test_minimax_covers_every_position_with_fastest_win_labels():
    records = make_minimax_records()
    assert len(records) == NUM_POSITIONS == 4520
    seen, sides = set(), {"X": 0, "O": 0}
    for r in records:
        assert set(r) == {"text"}
        b, side, thought, move = split_text(r["text"])
        assert thought is None and side == to_move(b)
        turn = "bot" if side == "X" else "player"
        assert r["text"] == make_prompt(b, "minimax") + move_text(move)
        assert f"<|turn|>{turn}\n<|symbol|>{side}\n<|move|>" in r["text"]
        assert move in best_moves(b)
        if immediate_wins(b):  # the original missed 392 of these
            assert move in immediate_wins(b)
        seen.add(b)
        sides[side] += 1
    assert len(seen) == 4520 and EMPTY_BOARD in seen
    assert sides == {"X": 2423, "O": 2097}
    # order: by number of pieces, deterministic
    counts = [9 - parse_board_block(r["text"]).count(" ") for r in records]
    assert counts == sorted(counts)


@pytest.mark.parametrize(
    "rows, fastest, slower",
    [
        (("XX.", "O..", "O.."), {2}, {4, 5, 7, 8}),  # X: wins now at 0-2, or in 3 / 5 plies elsewhere
        (("...", "XOX", ".XO"), {0}, {2, 6}),  # O: diagonal now, or a slower forced win
    ],
)
def test_fastest_win_is_the_label(rows, fastest, slower):
    b = board(*rows)
    scores = solve(b)
    assert all(0 < scores[m] < scores[next(iter(fastest))] for m in slower)  # slower wins exist
    by_board = {parse_board_block(r["text"]): parse_move(r["text"]) for r in make_minimax_records()}
    assert by_board[b] in fastest
    for seed in range(5):
        rec = make_minimax_records(seed)
        assert {parse_move(r["text"]) for r in rec if parse_board_block(r["text"]) == b} <= fastest


# ---------------------------------------------------------------- readers


def test_readers_round_trip(tmp_path):
    cases = [
        (read_sft, make_sft_records(30, "template", 5)),
        (read_sft, make_sft_records(30, "none", 5)),
        (read_dpo, make_dpo_records(30, "template", 5)),
        (read_grpo, make_grpo_records(30, 5)),
        (read_grpo, make_grpo_records(30, 5, prompt_style="player")),
        (read_minimax, make_minimax_records()),
    ]
    for k, (reader, records) in enumerate(cases):
        path = write_jsonl(tmp_path / f"{k}.jsonl", records)
        assert reader(path) == records


def test_readers_accept_the_original_layouts(tmp_path):
    b = board(".OX", "O..", "..X")  # the original's sft_template line 1 (X to move)
    think = "<player_think>Being player X, i'm feeling energized about this move at 1-2.</player_think>"
    sft = {"text": f"{make_prompt(b)}{think}\n<|move|><|1-2|><|end|>"}
    grpo_legacy = {"prompt": make_prompt(b).rstrip("\n"), "completion": f"{think}\n<|move|><|1-2|><|end|>"}
    minimax_not_fastest = {"text": make_prompt(board("XX.", "O..", "O.."), "minimax") + move_text(4)}
    for reader, rec in [(read_sft, sft), (read_grpo, grpo_legacy), (read_minimax, minimax_not_fastest)]:
        path = write_jsonl(tmp_path / "orig.jsonl", [rec])
        assert reader(path) == [rec]


GOOD_B = board("XO.", "...", "...")  # X to move


@pytest.mark.parametrize(
    "reader, bad, message",
    [
        (read_sft, {"text": "hello"}, "field 'text': no board block"),
        (read_sft, {"text": make_prompt(GOOD_B) + move_text(0)}, "field 'text': move 0-0 is on an occupied cell"),
        (read_sft, {"text": make_prompt(GOOD_B) + "<|move|><|1-1|>"}, "field 'text': no move"),
        (read_sft, {"text": make_prompt(GOOD_B).replace("<|player|>X", "<|player|>O") + move_text(4)},
         "field 'text': side line says O but X is to move"),
        (read_sft, {"text": make_prompt(board("XXX", "OO.", "...")) + move_text(5)},
         "field 'text': the board is already finished"),
        (read_sft, {"text": make_prompt(board("XX.", "...", "...")) + move_text(5)},
         r"field 'text': impossible board \(X=2, O=0\)"),
        (read_sft, {"text": 3}, "field 'text': expected str, got int"),
        (read_dpo, {"prompt": make_prompt(GOOD_B), "chosen": move_text(4)}, "missing field 'rejected'"),
        (read_dpo, {"prompt": make_prompt(GOOD_B), "chosen": move_text(4), "rejected": move_text(4)},
         "field 'rejected': same move as 'chosen'"),
        (read_dpo, {"prompt": make_prompt(GOOD_B), "chosen": move_text(1), "rejected": move_text(4)},
         "field 'chosen': move 0-1 is on an occupied cell"),
        (read_grpo, {"prompt": make_prompt(GOOD_B, "minimax") + MOVE_PREFIX, "completion": "0-0|><|end|>"},
         "field 'completion': move 0-0 is on an occupied cell"),
        (read_grpo, {"prompt": "no board", "completion": "1-1|><|end|>"}, "field 'prompt': no board block"),
        (read_minimax, {"text": make_prompt(GOOD_B) + move_text(4)}, "field 'text': missing <\\|symbol\\|> line"),
        (read_minimax, {"text": make_prompt(GOOD_B, "minimax") + "<|move|><|9-9|><|end|>"}, "field 'text': no move"),
    ],
)
def test_readers_name_file_line_and_field(tmp_path, reader, bad, message):
    good = {
        read_sft: make_sft_records(1, seed=0)[0],
        read_dpo: make_dpo_records(1, seed=0)[0],
        read_grpo: make_grpo_records(1, seed=0)[0],
        read_minimax: make_minimax_records()[0],
    }[reader]
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(DatasetError, match=rf"^{re.escape(str(path))}:3: {message}"):
        reader(path)


def test_reader_reports_invalid_json_line(tmp_path):
    path = tmp_path / "sft.jsonl"
    path.write_text(json.dumps(make_sft_records(1)[0]) + "\n{not json\n")
    with pytest.raises(DatasetError, match=r"sft\.jsonl:2: invalid JSON"):
        read_sft(path)


# ---------------------------------------------------------------- reward

X_BOARD = board(".XX", "...", "OO.")  # X to move: 0-0 wins, 2-2 blocks
O_BOARD = board("XX.", "OO.", "X..")  # O to move: 1-2 wins, 0-2 blocks
O_AFTER_CORNER = board("X..", "...", "...")  # O to move, no tactics
TWO_THREATS = board("XX.", "XO.", "..O")  # O to move; X threatens 0-2 and 2-0


@pytest.mark.parametrize(
    "b, cell, expected",
    [
        (X_BOARD, 0, 1.0), (X_BOARD, 8, 0.8), (X_BOARD, 4, 0.6), (X_BOARD, 3, 0.2), (X_BOARD, 1, -1.0),
        (EMPTY_BOARD, 4, 0.6), (EMPTY_BOARD, 2, 0.4), (EMPTY_BOARD, 7, 0.2),
        (O_BOARD, 5, 1.0), (O_BOARD, 2, 0.8), (O_BOARD, 8, 0.4), (O_BOARD, 7, 0.2), (O_BOARD, 0, -1.0),
        (O_AFTER_CORNER, 4, 0.6), (O_AFTER_CORNER, 6, 0.4), (O_AFTER_CORNER, 3, 0.2),
        (TWO_THREATS, 2, 0.8), (TWO_THREATS, 6, 0.8), (TWO_THREATS, 5, 0.2),
    ],
)
def test_move_quality_for_the_side_to_move(b, cell, expected):
    assert move_quality(b, cell) == expected
    for style in ("player", "minimax"):
        prompt = make_prompt(b, style)
        assert move_quality_reward(prompt, move_text(cell)) == expected
        assert move_quality_reward(prompt + MOVE_PREFIX, move_text(cell)[len(MOVE_PREFIX):]) == expected
    # without a side line the side comes from the piece counts
    assert move_quality_reward(board_block(b), move_text(cell)) == expected


def test_reward_is_not_x_only():
    # the original judged every move as X: O's winning move 1-2 would score as a block (0.8)
    assert move_quality(O_BOARD, 5, "X") == 0.8
    assert move_quality_reward(make_prompt(O_BOARD), move_text(5)) == 1.0
    # an explicit side line is trusted over the piece counts
    assert move_quality_reward(board_block(X_BOARD) + "\n<|player|>O\n", move_text(8)) == 1.0


@pytest.mark.parametrize(
    "prompt, completion",
    [
        (make_prompt(X_BOARD), "I would play the centre"),
        (make_prompt(X_BOARD), "<|move|><|3-3|><|end|>"),
        (make_prompt(X_BOARD), "<|move|><|1-1|>"),
        ("no board in this prompt", move_text(4)),
        (make_prompt(board("XXX", "OO.", "...")), move_text(8)),  # game already over
    ],
)
def test_reward_unparsable_or_invalid_is_minus_one(prompt, completion):
    assert move_quality_reward(prompt, completion) == -1.0


def test_move_quality_rejects_non_cells():
    assert move_quality(EMPTY_BOARD, None) == -1.0
    assert move_quality(EMPTY_BOARD, 9) == -1.0
    assert move_quality(EMPTY_BOARD, True) == -1.0


# ---------------------------------------------------------------- CLI


def test_cli_writes_each_kind(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main(["--kind", "sft", "--n", "20", "--think", "none", "--seed", "3"])
    assert read_sft(tmp_path / "tictactoe_sft_nothink.jsonl") == make_sft_records(20, "none", 3)
    main(["--kind", "dpo", "--n", "10"])
    assert len(read_dpo(tmp_path / "tictactoe_dpo_template.jsonl")) == 10
    main(["--kind", "sft", "--n", "5"])
    assert len(read_sft(tmp_path / "tictactoe_sft_template.jsonl")) == 5
    main(["--kind", "grpo", "--n", "10", "--output", str(tmp_path / "out" / "g.jsonl")])
    assert read_grpo(tmp_path / "out" / "g.jsonl") == make_grpo_records(10, 0)
    main(["--kind", "minimax"])
    (mm,) = tmp_path.glob("tictactoe_minimax_*.jsonl")
    assert re.fullmatch(r"tictactoe_minimax_\d{8}_\d{6}\.jsonl", mm.name)
    assert len(read_minimax(mm)) == 4520
    assert "wrote 4520 minimax records" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--kind", "minimax", "--n", "5"], ["--kind", "sft", "--n", "99999"],
                                  ["--kind", "rl"], ["--kind", "sft", "--think", "llm"]])
def test_cli_rejects_bad_arguments(tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert not list(tmp_path.iterdir())
