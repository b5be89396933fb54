import pytest

from ludic.context import FullDialog, TruncatedThinkingContext, make_context, truncate_thinking
from ludic.parsers import (
    boxed_parser,
    compose_parsers,
    think_move_parser,
    think_prefix_parser,
    xml_tag_parser,
)
from ludic.types import FinishReason, Rollout, SAWItem, Step, TokenTrace


def test_token_trace_validates_lengths_and_round_trips():
    t = TokenTrace((1, 2), (3, 4), (-0.1, -0.2), (0, 1), FinishReason.LENGTH)
    assert TokenTrace.from_dict(t.to_dict()) == t
    assert t.min_policy_version == 0
    with pytest.raises(ValueError, match="2 completion ids but 1 logprobs"):
        TokenTrace((1,), (3, 4), (-0.1,), (0, 0))


def test_rollout_round_trip_keeps_tokens():
    t = TokenTrace((1,), (2,), (-1.0,), (3,))
    r = Rollout(steps=[Step(0, "obs", "act", "a", None, 1.5, terminated=True, trace=t, info={"x": 1})],
                meta={"group_id": "g"})
    back = Rollout.from_dict(r.to_dict())
    assert back.id == r.id and back.steps[0].trace == t and back.total_reward == 1.5


def test_saw_item_checks_logprob_length():
    with pytest.raises(ValueError):
        SAWItem((1,), (2, 3), 1.0, logprobs=(-1.0,))
    it = SAWItem((1,), (2, 3), 0.5, logprobs=(-1.0, -2.0), policy_versions=(4, 2))
    assert SAWItem.from_dict(it.to_dict()) == it and it.min_policy_version == 2


def test_xml_tag_parser():
    p = xml_tag_parser("move", exact=True)
    assert p("<move>B2</move>").action == "B2"
    assert p("  <MOVE> b2 </MOVE>\n").action == "b2"
    r = p("I play <move>B2</move>")
    assert r.action is None and r.reward == -1.0 and "<move>" in r.obs
    assert p("<move></move>").action is None
    loose = xml_tag_parser("move", success_reward=0.1)
    assert loose("I play <move>B2</move>").action == "B2"
    assert loose("I play <move>B2</move>").reward == 0.1
    assert loose("<move>A1</move><move>B2</move>").action is None  # ambiguous


def test_think_prefix_and_compose():
    r = think_prefix_parser("<think>centre</think><move>B2</move>")
    assert r.action == "<move>B2</move>"
    assert think_prefix_parser("<move>B2</move>").action is None
    assert think_prefix_parser("<think>x</think>   ").action is None
    strict = think_move_parser()
    assert strict("<think>take the centre</think>\n<move>B2</move>").action == "B2"
    bad = strict("<think>hmm</think> I choose <move>B2</move>")
    assert bad.action is None and bad.reward == -1.0
    chained = compose_parsers(think_prefix_parser, xml_tag_parser("move", success_reward=0.25))
    assert chained("<think>a</think><move>C3</move>").reward == 0.25


def test_boxed_parser_nested():
    assert boxed_parser(r"so \boxed{\frac{1}{2}}").action == r"\frac{1}{2}"
    assert boxed_parser("no answer").action is None


def test_truncated_thinking_context():
    assert truncate_thinking("<think>long reasoning</think><move>B2</move>") == "<think>[TRUNCATED]</think><move>B2</move>"
    assert truncate_thinking("<move>B2</move>") == "<move>B2</move>"
    assert truncate_thinking("<think>unclosed <move>B2</move>") == "<think>unclosed <move>B2</move>"
    ctx = TruncatedThinkingContext("sys")
    ctx.reset("env prompt")
    ctx.add_observation("board 1")
    ctx.add_response("<think>I think a lot</think><move>B2</move>")
    ctx.add_observation("board 2")
    msgs = ctx.messages()
    assert msgs[0] == {"role": "system", "content": "sys"}
    assert msgs[2]["content"] == "<think>[TRUNCATED]</think><move>B2</move>"
    assert ctx.history[2]["content"] == "<think>I think a lot</think><move>B2</move>"  # full history kept
    assert not ctx.append_only and FullDialog.append_only


def test_make_context_names():
    assert isinstance(make_context("full"), FullDialog)
    assert isinstance(make_context("truncated"), TruncatedThinkingContext)
    last = make_context("last", "sys")
    last.reset()
    for m in ("o1", "a1"):
        last.add_observation(m) if m.startswith("o") else last.add_response(m)
    last.add_observation("o2")
    assert [m["content"] for m in last.messages()] == ["sys", "o2"]
    with pytest.raises(ValueError, match="unknown context 'x'"):
        make_context("x")
    ctx = make_context("full")
    ctx.reset("from env")
    assert ctx.messages()[0]["content"] == "from env"
