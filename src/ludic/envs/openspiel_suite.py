"""The OpenSpiel task suite behind ``OpenSpielEnv`` (``ludic.envs.openspiel``): its games in order, task ids and
their parameter variants, each game's rules as a system prompt, readable seat views for the poker games, and
the bots that play the seats no agent plays (random, and pyspiel's MCTS at the suite's per-game strength)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

GAMES: tuple[str, ...] = (
    "goofspiel", "liars_dice", "leduc_poker", "gin_rummy", "othello", "backgammon", "hex", "clobber",
    "hearts", "euchre", "dots_and_boxes", "go", "chess", "checkers", "quoridor", "blackjack",
    "phantom_ttt", "2048", "solitaire", "bridge", "amazons", "oware",
)
"""The suite's game list, in its (append-only) order: ``task_id // 10**8`` indexes it."""


TASK_BLOCK = 100_000_000
"""Config ids per game in a task id (``GGGGCCCCCCCC``)."""


MCTS_PRESETS: dict[str, tuple[int, int] | None] = {
    "goofspiel": None, "liars_dice": (3000, 200), "leduc_poker": (3000, 200), "gin_rummy": (500, 10),
    "othello": (1000, 20), "backgammon": (600, 15), "hex": (1000, 50), "clobber": (1500, 100),
    "hearts": (500, 50), "euchre": (1000, 100), "dots_and_boxes": (1200, 100), "go": (300, 30),
    "chess": (200, 20), "checkers": (500, 50), "quoridor": (800, 80), "blackjack": None,
    "phantom_ttt": (3000, 150), "2048": None, "solitaire": None, "bridge": (200, 30),
    "amazons": (200, 20), "oware": (300, 30),
}
"""The suite's MCTS opponent per game: (max simulations, random rollouts per leaf); None: the
random bot. Expensive (liars_dice: seconds to minutes a move on 2 cores); tests scale it down."""


RULES: dict[str, str] = {
    "goofspiel": "Each player holds bid cards 1..N. Each round a prize card is revealed; both players bid a card "
                 "at the same time, the higher bid wins the prize's points and tied bids win nothing. Bid cards "
                 "are used once. Most points at the end wins.",
    "liars_dice": "Each player rolls dice hidden from the others. Players take turns bidding 'quantity-face': at "
                  "least that many dice across all players show that face. A bid must raise the quantity or the "
                  "face. 6s are wild. Instead of bidding you may call 'Liar': if the bid holds, the caller loses, "
                  "otherwise the bidder loses.",
    "leduc_poker": "A six-card deck (J, Q, K in two suits). Each player antes 1 chip and gets one private card. "
                   "Two betting rounds (raise 2 in the first, 4 in the second, at most 2 raises per round); a public "
                   "card is shown before the second. A pair with the public card beats any high card; otherwise "
                   "the higher card wins. Folding loses the pot.",
    "kuhn_poker": "A three-card deck (J, Q, K). Each player antes 1 chip and gets one private card. Players may pass "
                  "or bet 1 chip; a bet must be called or folded. At showdown the higher card wins the pot.",
    "gin_rummy": "Form melds: sets of 3-4 cards of one rank or runs of 3+ cards of one suit (ace low). Each turn draw "
                 "the upcard or from the stock, then discard. Knock when your unmatched cards (deadwood) total at "
                 "most the knock card; gin (no deadwood) earns a bonus. Lower deadwood wins the hand.",
    "othello": "8x8 board. Place a disc so that it brackets a straight line of opponent discs between it and one of "
               "yours; those discs flip to your color. If you cannot move you pass. Most discs at the end wins.",
    "backgammon": "Move your 15 checkers around the board by the dice and bear them all off first. A single "
                  "opponent checker on a point can be hit and sent to the bar; points with two or more opponent "
                  "checkers are blocked. Checkers on the bar must re-enter first.",
    "hex": "Players alternately place stones on a rhombus of hexagons. Red (x) connects the top and bottom sides, "
           "Blue (o) the left and right sides. The first to connect their sides wins; there are no draws.",
    "clobber": "Players move one of their pieces onto an orthogonally adjacent opponent piece, capturing it. Every "
               "move is a capture. The player who cannot move loses.",
    "hearts": "Four players, 13 tricks. Follow suit if you can; the highest card of the led suit wins the trick. "
              "Each heart is 1 point, the queen of spades 13. Lowest total points wins.",
    "euchre": "Four players in two partnerships, 24-card deck. Players bid to name trump; the makers must take at "
              "least 3 of 5 tricks. Follow suit if you can; the jacks of the trump color are the highest trumps.",
    "dots_and_boxes": "Players take turns drawing a line between two adjacent dots. Completing the fourth side of a "
                      "box scores it and gives another turn. Most boxes wins.",
    "go": "Players alternately place stones on the intersections. Groups without liberties are captured. Area "
          "scoring with komi for White; the higher score wins.",
    "chess": "Standard chess: checkmate the opponent's king. Stalemate, repetition and the 50-move rule draw.",
    "checkers": "Move diagonally forward; capture by jumping over an adjacent opponent piece, and captures are "
                "mandatory. A piece reaching the far row becomes a king that moves both ways. Capture or block "
                "all opponent pieces to win.",
    "quoridor": "Move your pawn one square or place a wall to block paths (never closing every path). The first "
                "pawn to reach the opposite side wins.",
    "blackjack": "Draw cards (hit) or stop (stand) to get closer to 21 than the dealer without going over. Face cards "
                 "count 10, aces 1 or 11.",
    "phantom_ttt": "Tic-tac-toe where you cannot see the opponent's marks. Choosing an occupied cell reveals it and "
                   "you move again. Three in a row wins.",
    "2048": "Slide all tiles up, down, left or right; equal tiles that collide merge into their sum, scoring it. A "
            "new tile appears after each move. The game ends when no move is possible.",
    "solitaire": "Klondike solitaire: build the four foundations from ace to king by suit, moving cards between "
                 "tableau piles in descending, alternating-color order. Points are scored for progress.",
    "bridge": "Four players in two partnerships. An auction fixes the contract (tricks to take, trump suit); the "
              "declarer's side must take at least that many of the 13 tricks. Follow suit if you can.",
    "amazons": "Each turn move one of your amazons like a chess queen, then shoot an arrow from it like a queen; the "
               "arrow's square is blocked for the rest of the game. The player who cannot move loses.",
    "oware": "Sow the seeds of one of your houses counter-clockwise, one per house. If the last seed makes a house on "
             "the opponent's side hold 2 or 3 seeds, capture them (and the preceding such houses). Most seeds wins.",
    "tic_tac_toe": "Players alternately mark cells of a 3x3 grid; three marks in a row, column or diagonal wins.",
    "connect_four": "Players alternately drop a disc into a column of a 6x7 grid; four in a row in any direction wins.",
}
"""Short rules per game (the system prompt); other games get pyspiel's long name only."""


@dataclass(frozen=True)
class GameTask:
    """A task id decoded: which game, with which parameters."""

    task_id: int
    game: str
    config_id: int
    params: dict[str, Any]
    variant: str
    """Human-readable variant label (e.g. ``num_cards=10``)."""


def game_params(game: str, config_id: int) -> tuple[dict[str, Any], str]:
    """The suite's parameter variant ``config_id`` of ``game``: (pyspiel params, label)."""
    c = int(config_id)
    p: dict[str, Any]
    if game == "goofspiel":
        p = {"players": 2, "num_cards": 8 + 2 * (c % 5), "points_order": "random"}
    elif game == "liars_dice":
        p = {"players": 2, "numdice": 5}
    elif game == "leduc_poker":
        p = {"players": 2}
    elif game == "gin_rummy":
        p = {"hand_size": 7 + (c // 3) % 3, "knock_card": 10 - c % 3}
    elif game == "hex":
        p = {"board_size": 5 + 2 * (c % 4)}
    elif game == "clobber":
        p = {"rows": 5 + c % 3, "columns": 5 + c % 3}
    elif game == "hearts":
        p = {"pass_cards": bool(c & 1), "jd_bonus": bool(c & 2), "avoid_all_tricks_bonus": bool(c & 4)}
    elif game == "euchre":
        p = {"allow_lone_defender": bool(c & 1), "stick_the_dealer": bool(c & 2)}
    elif game == "dots_and_boxes":
        p = {"num_rows": 3 + c % 3, "num_cols": 3 + c % 3}
    elif game == "go":
        p = {"board_size": 5 + 2 * (c % 2), "komi": 7.5}
    elif game == "quoridor":
        p = {"board_size": (7, 9)[c % 2], "wall_count": (8, 10)[(c // 2) % 2]}
    elif game == "phantom_ttt":
        p = {"obstype": ("reveal-nothing", "reveal-numturns")[c % 2]}
    elif game == "amazons":
        p = {"board_size": (6, 8, 10)[c % 3]}
    elif game == "oware":
        p = {"num_seeds_per_house": (4, 3, 5)[c % 3]}
    elif game == "bridge":
        # The suite labels rubber / chicago / duplicate; pyspiel's bridge has one scoring, so the
        # variants differ only in their label.
        return {}, ("rubber", "chicago", "duplicate")[c % 3]
    else:
        p = {}
    label = ",".join(f"{k}={v}" for k, v in p.items() if k != "players") or "default"
    return p, label


def decode_task(task_id: int) -> GameTask:
    """``task_id`` -> game and parameters (``game_index * 10**8 + config_id``, game index modulo 22)."""
    if not isinstance(task_id, (int, np.integer)) or task_id < 0:
        raise ValueError(f"task_id must be a non-negative integer (GGGGCCCCCCCC), got {task_id!r}")
    game = GAMES[(int(task_id) // TASK_BLOCK) % len(GAMES)]
    config_id = int(task_id) % TASK_BLOCK
    params, label = game_params(game, config_id)
    return GameTask(int(task_id), game, config_id, params, label)


def task_id_for(game: str, config_id: int = 0) -> int:
    """The task id of ``game`` (a name in ``GAMES``) with variant ``config_id``."""
    if game not in GAMES:
        raise ValueError(f"{game!r} is not in the task list; known: {', '.join(GAMES)}")
    return GAMES.index(game) * TASK_BLOCK + int(config_id)


def load_game(game: str, params: dict[str, Any] | None = None) -> Any:
    """``pyspiel.load_game`` with a clear error for unknown names and parameters."""
    try:
        import pyspiel
    except ImportError as e:  # pragma: no cover - open-spiel is a dependency of the games extra
        raise ImportError("OpenSpiel games need pyspiel: pip install 'ludic[games]' (open-spiel)") from e
    if game not in pyspiel.registered_names():
        raise ValueError(f"unknown pyspiel game {game!r}")
    try:
        return pyspiel.load_game(game, dict(params or {}))
    except Exception as e:
        raise ValueError(f"pyspiel cannot load {game!r} with parameters {params}: {e}") from e


_KUHN_CARDS = "JQK"


_LEDUC_CARDS = ("J\u2660", "J\u2665", "Q\u2660", "Q\u2665", "K\u2660", "K\u2665")


_LEDUC_MOVES = {"0": "fold", "1": "call", "2": "raise"}


def kuhn_text(info_state: str, seat: int) -> str:
    """Kuhn poker's information state ("1pb": card Q, then pass, bet) in words."""
    card, history = int(info_state[0]), info_state[1:]
    put = [1, 1]
    moves = []
    for i, ch in enumerate(history):
        who = i % 2
        if ch == "b":
            put[who] += 1
        moves.append(f"Player {who} {'bet' if ch == 'b' else 'passed'}")
    return (f"Your card: {_KUHN_CARDS[card]}\nActions so far: {', '.join(moves) or 'none'}\n"
            f"Pot: {sum(put)} chips (you put in {put[seat]}, your opponent {put[1 - seat]})")


def leduc_text(info_state: str, seat: int) -> str:
    """Leduc poker's information state ("[Private: 3][Round 2]...[Round1: 2 1][Round2: ]") in words."""
    fields = dict(re.findall(r"\[([^:\]]+):? ?([^\]]*)\]", info_state))
    try:
        card = _LEDUC_CARDS[int(fields["Private"])]
        public = fields.get("Public")
        money = [int(x) for x in fields["Money"].split()]
        rounds = [" ".join(_LEDUC_MOVES.get(m, m) for m in fields.get(f"Round{k}", "").split()) or "none"
                  for k in (1, 2)]
    except (KeyError, ValueError, IndexError):
        return info_state  # an unexpected format: the raw string still identifies the state
    board = f"Public card: {_LEDUC_CARDS[int(public)]}" if public not in (None, "") else "Public card: not dealt yet"
    rnd = next((k for k in fields if k.startswith("Round ")), "Round 1").split()[-1]
    return (f"Your card: {card}\n{board}\nBetting round: {rnd} of 2\nPot: {fields.get('Pot', '?')} chips; "
            f"your chips left: {money[seat]}, your opponent's: {money[1 - seat]}\n"
            f"Round 1 actions: {rounds[0]}\nRound 2 actions: {rounds[1]}")


READABLE: dict[str, Callable[[str, int], str]] = {"kuhn_poker": kuhn_text, "leduc_poker": leduc_text}
"""Games whose seat view is their information state in words."""


Bot = Callable[[Any, int], int]
"""``(state, player) -> action`` for a seat no agent plays."""


def random_bot(rng: np.random.RandomState) -> Bot:
    """Uniform over the legal actions, from ``rng``."""
    def act(state: Any, player: int) -> int:
        legal = state.legal_actions(player)
        return int(legal[rng.randint(len(legal))])
    return act


def mcts_bot(game: Any, simulations: int, rollouts: int, seed: int, uct_c: float = 1.414) -> Bot:
    """pyspiel's MCTS (random-rollout evaluator, uniform prior). On imperfect-information games it
    searches the true state (it sees hidden cards), as the suite's MCTS opponent does."""
    import pyspiel

    evaluator = pyspiel.RandomRolloutEvaluator(int(rollouts), int(seed) % 2**31)
    bot = pyspiel.MCTSBot(game, evaluator, float(uct_c), int(simulations), 1000, False, (int(seed) + 1) % 2**31, False)

    def act(state: Any, player: int) -> int:
        return int(bot.step(state))
    return act


def make_bot(kind: str | Bot, game: Any, name: str, player: int, seed: int,
             mcts: tuple[int, int] | None = None) -> Bot:
    """The opponent ``kind`` ("random", "mcts" or a callable) for ``player``, seeded from ``seed``
    the suite's way (``seed + 2 + player``)."""
    import pyspiel

    if callable(kind):
        return kind
    base = seed + 2 + player
    simultaneous = game.get_type().dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS
    if kind == "random" or simultaneous:
        return random_bot(np.random.RandomState((base + 2) % 2**32))
    if kind == "mcts":
        setting = mcts if mcts is not None else MCTS_PRESETS.get(name)
        if setting is None:
            return random_bot(np.random.RandomState((base + 2) % 2**32))
        return mcts_bot(game, setting[0], setting[1], base + 3)
    raise ValueError(f"unknown opponent {kind!r}: use random, mcts or a callable (state, player) -> action")
