"""OpenSpiel games as Ludic envs: any pyspiel game, played by LLM agents through action ids.

Each turn an agent sees the state from its own seat (pyspiel's observation string, else its
information-state string; never another seat's private information) and one ``id -> action``
line per legal action, and answers with an action id. The rules come once, as the suggested
system prompt. Answers are parsed as the task suite this follows does it (see
``parse_action``); a seat gets ``max_attempts`` tries per turn, then the game ends with score 0
for that seat.

Task ids (``decode_task``): ``task_id = game_index * 10**8 + config_id`` over ``GAMES``, the
22 games of that suite in its order, each with its parameter variants (``game_params``).
The episode RNG comes from the reset seed: chance outcomes, the random bot and the MCTS
bots' seeds, and the LLM's seat (``seed % 2``, modulo the number of players). The same task
id and seed replay the same game.

Scores (``score_for``): zero-sum games map the return into [0, 1] with the game's utility
bounds (win 1, draw 0.5, loss 0 for a +-1 game); other games with more than two players
score by rank, two-player general-sum games 1 / 0.5 / 0, one-player games by their
utility bounds. A seat's rewards sum to its score: games with intermediate rewards (2048,
solitaire) pay them as they come, normalised, and the last step pays the rest.

Opponents for the seats no agent plays (``make_bot``): ``random`` (uniform over legal
actions) or ``mcts`` (pyspiel's C++ MCTS with random rollouts; ``MCTS_PRESETS`` holds the
suite's per-game strength, ``mcts=(simulations, rollouts)`` overrides it). Simultaneous-move
games always get random bots, as in the suite. LLM opponents (self-play, league snapshots)
are agents: list their seats in ``seats`` and drive the env with ``MultiAgentProtocol``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ludic.envs.base import LudicEnv
from ludic.types import JSON, StepOutcome

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

RETRY_MESSAGE = ("Invalid response format. You must respond with ONLY the action ID number (e.g., '5'). "
                 "This is attempt {attempt} of {attempts}.")
"""What a seat sees after an answer that names no legal action (the suite's wording)."""

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


_INT_RE = re.compile(r"^\s*[-+]?\d+\s*$")
_THINK_RE = re.compile(r"<(think|thinking)>.*?</\1>", re.DOTALL | re.IGNORECASE)
_OPEN_THINK_RE = re.compile(r"<(think|thinking)>.*$", re.DOTALL | re.IGNORECASE)


def strip_thinking(text: str) -> str:
    """Remove ``<think>...</think>`` blocks and an unclosed ``<think>`` tail."""
    return _OPEN_THINK_RE.sub("", _THINK_RE.sub("", text)).strip()


def parse_action(reply: str, legal: Sequence[int], names: Sequence[str]) -> int | None:
    """The action a reply names, the suite's way; None when it names no legal action.

    1. the whole reply is an integer: that action if it is legal (an illegal number fails);
    2. else the first legal id, in legal-action order, that appears as a whole word;
    3. else the first legal action whose string (lower-cased) appears in the reply, or whose
       letters and digits (two or more: the suite also took one, so "banana" named solitaire's
       "♠ <- A♠") appear in the reply's letters and digits.
    """
    text = strip_thinking(reply)
    if _INT_RE.match(text):
        value = int(text)
        return value if value in legal else None
    for a in legal:
        if re.search(rf"(?<![\w-]){a}(?!\w)", text):
            return a
    low = text.lower()
    alnum = re.sub(r"[^a-z0-9]", "", low)
    for a, name in zip(legal, names):
        s = name.lower().strip()
        if s and s in low:
            return a
        s_alnum = re.sub(r"[^a-z0-9]", "", s)
        if len(s_alnum) >= 2 and s_alnum in alnum:  # 1 character ("♠ <- A♠" -> "a") matches anything
            return a
    return None


def score_for(game: Any, returns: Sequence[float], player: int) -> float:
    """``player``'s score in [0, 1] from the final ``returns`` (see the module docstring)."""
    import pyspiel

    n = game.num_players()
    lo, hi = game.min_utility(), game.max_utility()
    r = float(returns[player])
    if game.get_type().utility == pyspiel.GameType.Utility.ZERO_SUM or n == 1:
        return float(np.clip((r - lo) / (hi - lo), 0.0, 1.0)) if hi > lo else 0.5
    if n > 2:
        rank = sum(1 for x in returns if x > r)  # ties share the better rank
        return 1.0 - rank / (n - 1)
    other = float(returns[1 - player])
    return 1.0 if r > other else 0.5 if r == other else 0.0


# ------------------------------------------------------------------------- readable states
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


# ---------------------------------------------------------------------------------------- bots
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


# ----------------------------------------------------------------------------------------- env
class OpenSpielEnv(LudicEnv):
    """A pyspiel game whose seats are LLM agents and bots.

    Args:
        game: a pyspiel game name (``kuhn_poker``, ``tic_tac_toe``, ...) with ``params``; or
        task_id: a task of the suite (``decode_task``), instead of ``game``.
        seats: which seats agents play. ``"seed"`` (default): one seat, ``seed % 2`` modulo
            the number of players, as agent ``agent_0``; ``"all"``: every seat (self-play),
            agents ``player_<k>``; a list of seat numbers: those seats, ``player_<k>``.
        opponent: the bot of every other seat: ``"random"``, ``"mcts"`` or a callable
            ``(state, player) -> action``.
        mcts: (simulations, rollouts) for ``"mcts"``, instead of the game's preset.
        max_attempts: answers per turn before the seat forfeits (score 0).
        invalid_reward: reward of an answer that names no legal action (the game goes on).
        readable: kuhn_poker and leduc_poker state in words (``READABLE``) instead of pyspiel's
            terse strings ("1b", "[Private: 3][Round1: 1 1]..."); both identify the same
            information state.
    """

    def __init__(
        self,
        game: str | None = None,
        *,
        task_id: int | None = None,
        params: dict[str, Any] | None = None,
        seats: str | Sequence[int] = "seed",
        opponent: str | Bot = "random",
        mcts: tuple[int, int] | None = None,
        max_attempts: int = 3,
        invalid_reward: float = 0.0,
        readable: bool = True,
    ) -> None:
        if (game is None) == (task_id is None):
            raise ValueError("OpenSpielEnv: give a game name or a task_id (one of them)")
        if task_id is not None:
            self.task = decode_task(task_id)
            if params:
                raise ValueError("OpenSpielEnv: a task_id fixes the parameters; do not pass params")
        else:
            self.task = GameTask(-1, str(game), 0, dict(params or {}), "custom")
        self.game = load_game(self.task.game, self.task.params)
        self.num_players = self.game.num_players()
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        if seats == "seed":
            self._fixed_seats: list[int] | None = None
            self._ids = ["agent_0"]
        else:
            fixed = list(range(self.num_players)) if seats == "all" else [int(s) for s in seats]
            bad = [s for s in fixed if not 0 <= s < self.num_players]
            if bad or not fixed or len(set(fixed)) != len(fixed):
                raise ValueError(f"seats {list(seats)!r} must be distinct seats of {self.task.game} "
                                 f"(0..{self.num_players - 1})")
            self._fixed_seats = sorted(fixed)
            self._ids = [f"player_{s}" for s in self._fixed_seats]
        self.opponent, self.mcts = opponent, mcts
        self.max_attempts, self.invalid_reward, self.readable = max_attempts, invalid_reward, readable
        self.state: Any = None
        self.seat_of: dict[str, int] = {}
        self._bots: dict[int, Bot] = {}
        self._rng = np.random.RandomState(0)
        self._seed = 0
        self._attempts: dict[str, int] = {}
        self._paid: dict[str, float] = {}
        self._due: dict[str, float] = {}
        """Intermediate rewards earned since the seat's last outcome (REWARDS games)."""
        self._pending: dict[int, int] = {}
        self._forfeit: str | None = None
        self.history: list[dict[str, Any]] = []

    # -- identity ------------------------------------------------------------------------
    @property
    def agent_ids(self) -> list[str]:
        return list(self._ids)

    @property
    def game_name(self) -> str:
        return self.task.game

    @property
    def suggested_sysprompt(self) -> str:
        rules = RULES.get(self.task.game) or f"The game {self.game.get_type().long_name} (OpenSpiel)."
        return (f"You are playing {self.task.game}.\n\n# Game Rules\n{rules}\n\n# Output Format\n"
                "You must respond with ONLY the action ID (a single number).\n"
                "Do NOT include descriptions or explanations.\nExamples:\n"
                '- For action "0 -> roll": respond "0"\n- For action "89 -> a3": respond "89"')

    @property
    def over(self) -> bool:
        return self.state is None or self.state.is_terminal() or self._forfeit is not None

    @property
    def active_agents(self) -> list[str]:
        if self.over:
            return []
        if self.state.is_simultaneous_node():
            return [a for a, s in self.seat_of.items() if s not in self._pending]
        p = self.state.current_player()
        return [a for a, s in self.seat_of.items() if s == p]

    # -- text ----------------------------------------------------------------------------
    def state_text(self, seat: int) -> str:
        """The state as ``seat`` may see it (no other seat's private information): a readable
        rendering of the information state for the poker games of ``READABLE``, else pyspiel's
        observation string, else its information-state string."""
        t = self.game.get_type()
        if self.readable and self.task.game in READABLE:
            return READABLE[self.task.game](self.state.information_state_string(seat), seat)
        if t.provides_observation_string:
            return self.state.observation_string(seat)
        if t.provides_information_state_string:
            return self.state.information_state_string(seat)
        import pyspiel

        if t.information == pyspiel.GameType.Information.PERFECT_INFORMATION:
            return str(self.state)
        raise ValueError(f"{self.task.game} gives no observation or information-state string for a seat")

    def legal_lines(self, seat: int) -> tuple[list[int], list[str]]:
        legal = [int(a) for a in self.state.legal_actions(seat)]
        return legal, [self.state.action_to_string(seat, a) for a in legal]

    def turn_text(self, seat: int) -> str:
        """What ``seat`` sees when it must act: its view of the state and its legal actions."""
        legal, names = self.legal_lines(seat)
        lines = "\n".join(f"{a} -> {n}" for a, n in zip(legal, names))
        return (f"Current State:\n{self.state_text(seat)}\n\nYou are Player {seat}.\nLegal Actions:\n{lines}\n\n"
                "Your choice (ID only):")

    def observe(self, agent_id: str) -> str:
        seat = self.seat_of[agent_id]
        if self.over:
            return self._final_text(agent_id)
        if agent_id not in self.active_agents:
            return f"Current State:\n{self.state_text(seat)}\n\nYou are Player {seat}. Waiting for the other players."
        return self.turn_text(seat)

    def _final_text(self, agent_id: str) -> str:
        seat = self.seat_of[agent_id]
        score = self.score(agent_id)
        how = ("you forfeited after invalid answers" if self._forfeit == agent_id
               else "the other player forfeited" if self._forfeit is not None else "game over")
        return (f"Game over ({how}). Returns: {self.returns()}. You are Player {seat}; "
                f"your score: {score:.3f} ({'win' if score > 0.5 else 'draw' if score == 0.5 else 'loss'}).")

    # -- results -------------------------------------------------------------------------
    def returns(self) -> list[float]:
        return [float(x) for x in self.state.returns()]

    def score(self, agent_id: str) -> float:
        """The seat's score in [0, 1] (at the end of the game)."""
        if self._forfeit is not None:
            return 0.0 if agent_id == self._forfeit else 1.0
        return score_for(self.game, self.returns(), self.seat_of[agent_id])

    # -- episode -------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> dict[str, tuple[str, JSON]]:
        self._seed = 0 if seed is None else int(seed)
        self._rng = np.random.RandomState(self._seed % 2**32)
        seats = self._fixed_seats if self._fixed_seats is not None else [(self._seed % 2) % self.num_players]
        self.seat_of = dict(zip(self._ids, seats))
        self._bots = {p: make_bot(self.opponent, self.game, self.task.game, p, self._seed, self.mcts)
                      for p in range(self.num_players) if p not in seats}
        self.state = self.game.new_initial_state()
        self._attempts = {a: 0 for a in self._ids}
        self._paid = {a: 0.0 for a in self._ids}
        self._due = {}
        self._pending, self._forfeit, self.history = {}, None, []
        self._advance()
        info = {"game": self.task.game, "task_id": self.task.task_id, "variant": self.task.variant,
                "seed": self._seed, "num_players": self.num_players}
        return {a: (self.observe(a), {**info, "seat": self.seat_of[a]}) for a in self._ids}

    def _advance(self) -> None:
        """Play chance and bot moves until an agent must act or the game ends."""
        while not self.state.is_terminal():
            if self.state.is_chance_node():
                outcomes, probs = zip(*self.state.chance_outcomes())
                action = int(outcomes[self._rng.choice(len(outcomes), p=np.asarray(probs) / sum(probs))])
                self._apply(action, -1)
            elif self.state.is_simultaneous_node():
                if self.seat_of:
                    return
                self._apply_joint({})
            else:
                p = self.state.current_player()
                if p in self.seat_of.values():
                    return
                self._apply(self._bots[p](self.state, p), p)

    def _apply(self, action: int, player: int) -> None:
        self.history.append({"player": player, "action": action,
                             "action_str": self.state.action_to_string(player, action) if player >= 0
                             else self.state.action_to_string(action)})
        self.state.apply_action(action)
        self._collect_intermediate()

    def _apply_joint(self, chosen: dict[int, int]) -> None:
        joint = [chosen[p] if p in chosen else self._bots[p](self.state, p) for p in range(self.num_players)]
        for p, a in enumerate(joint):
            self.history.append({"player": p, "action": a, "action_str": self.state.action_to_string(p, a)})
        self.state.apply_actions(joint)
        self._collect_intermediate()

    def _collect_intermediate(self) -> None:
        """Rewards of games that pay as they go (normalised like the score); paid in ``step``."""
        if self.state.is_terminal():
            return
        import pyspiel

        if self.game.get_type().reward_model != pyspiel.GameType.RewardModel.REWARDS:
            return
        span = self.game.max_utility() - self.game.min_utility()
        rewards = self.state.rewards()
        for a, s in self.seat_of.items():
            self._due[a] = self._due.get(a, 0.0) + (float(rewards[s]) / span if span > 0 else 0.0)

    def step(self, actions: dict[str, str]) -> dict[str, StepOutcome]:
        if self.over:
            raise RuntimeError("OpenSpielEnv.step() called after the game ended")
        active = self.active_agents
        unknown = set(actions) - set(active)
        if unknown or not actions:
            raise ValueError(f"expected actions of {active}, got {sorted(actions)}")
        infos: dict[str, JSON] = {}
        for agent, reply in actions.items():
            seat = self.seat_of[agent]
            legal, names = self.legal_lines(seat)
            action = parse_action(reply, legal, names)
            if action is None:
                self._attempts[agent] += 1
                infos[agent] = {"invalid": True, "attempt": self._attempts[agent], "reply": reply[:200]}
                if self._attempts[agent] >= self.max_attempts:
                    self._forfeit = agent
                continue
            self._attempts[agent] = 0
            infos[agent] = {"action": action, "action_str": names[legal.index(action)], "attempts_used": 0}
            if self.state.is_simultaneous_node():
                self._pending[seat] = action
            else:
                self._apply(action, seat)
        if self._forfeit is None:
            if self.state.is_simultaneous_node() and not self.active_agents:
                chosen, self._pending = dict(self._pending), {}
                self._apply_joint(chosen)
            self._advance()
        return self._outcomes(actions, infos)

    def _outcomes(self, actions: dict[str, str], infos: dict[str, JSON]) -> dict[str, StepOutcome]:
        out = {}
        for agent in self._ids:
            info = dict(infos.get(agent, {}))
            if agent in actions and info.get("invalid") and not self.over:
                msg = RETRY_MESSAGE.format(attempt=self._attempts[agent] + 1, attempts=self.max_attempts)
                # the turn again below it: a history-free context (ctx last) still shows the state
                out[agent] = StepOutcome(f"{msg}\n\n{self.turn_text(self.seat_of[agent])}", self.invalid_reward,
                                         info=info)
                continue
            reward = self.invalid_reward if info.get("invalid") else 0.0
            if self.over:
                score = self.score(agent)
                reward += score - self._paid[agent]
                self._paid[agent] = score
                info.update(score=score, success=score > 0.5, returns=self.returns(), seat=self.seat_of[agent],
                            game=self.task.game, task_id=self.task.task_id, forfeit=self._forfeit)
            else:
                due = self._due.pop(agent, 0.0)
                reward += due
                self._paid[agent] += due
            out[agent] = StepOutcome(self.observe(agent), reward, terminated=self.over, info=info)
        return out
