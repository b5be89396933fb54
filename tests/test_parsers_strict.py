"""Tag parsers: exactly one tag means exactly one, and scanning is linear in the input."""

import pytest

from ludic.parsers import regex_parser, think_move_parser, xml_tag_parser

NOT_ONE_TAG = [
    "<move>B2</move><move>C3</move>",  # several
    "<move><move>B2</move></move>",  # nested
    "<move>B2</move></move>",  # extra closing tag
    "<move><move>B2</move>",  # extra opening tag
    "<move>B2<move>C3</move>",  # an opening tag inside the action
    "<move>B2</move>C3</move>",  # a closing tag inside the trailing text
]


@pytest.mark.parametrize("answer", NOT_ONE_TAG)
def test_think_move_parser_rejects_anything_but_one_move_tag(answer):
    r = think_move_parser()(f"<think>x</think>{answer}")
    assert r.action is None and r.reward == -1.0 and "<move>" in r.obs


@pytest.mark.parametrize("answer", NOT_ONE_TAG)
def test_exact_xml_tag_parser_rejects_anything_but_one_tag(answer):
    assert xml_tag_parser("move", exact=True)(answer).action is None


@pytest.mark.parametrize("answer", NOT_ONE_TAG)
def test_loose_xml_tag_parser_rejects_anything_but_one_tag(answer):
    assert xml_tag_parser("move")(f"I play {answer} now").action is None


def test_valid_outputs_still_parse():
    strict = think_move_parser()
    assert strict("<think>x</think><move>B2</move>").action == "B2"
    assert strict("  <think>a <move>A1</move>?</think>\n<MOVE> c3 </Move>\n").action == "c3"
    assert xml_tag_parser("move", exact=True)("<move>B2</move>").action == "B2"
    loose = xml_tag_parser("move", success_reward=0.5)
    assert loose("I play <move>A1</move>, the corner.").action == "A1"
    assert loose("I play <move>A1</move>, the corner.").reward == 0.5
    assert loose("<move> </move>").action is None  # empty action


def test_unclosed_tags_are_rejected_in_linear_time():
    # The old lazy-regex scan retried `.*?` from every unclosed tag to the end of the
    # text: ~20 s for this input. A linear scan answers in milliseconds.
    many = "<move>" * 20_000
    assert xml_tag_parser("move")(many).action is None
    assert xml_tag_parser("move")("<move>B2</move>" + many).action is None  # stray tags: not one tag
    assert xml_tag_parser("move", exact=True)(many + "B2</move>").action is None
    assert think_move_parser()("<think>x</think>" + many).action is None


def test_regex_parser_takes_the_whole_output_only():
    cell = regex_parser(r"[A-C][1-3]", feedback="Answer with one cell such as B2.")
    assert cell("B2").action == "B2"
    assert cell(" c3\n").action == "c3"  # surrounding whitespace and case do not matter
    for bad in ("B4", "B2 C3", "I play B2", "<move>B2</move>", "", "B2."):
        r = cell(bad)
        assert r.action is None and r.reward == -1.0 and r.obs == "Answer with one cell such as B2."
    assert regex_parser(r"\d+", success_reward=0.1)("17").reward == 0.1
