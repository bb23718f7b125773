"""Reasoning parsers: <think> blocks split from the answer, whole and streamed in random pieces."""

from __future__ import annotations

import random

import pytest

from engine.core.serving import parsers

CASES = {
    "qwen3": [
        ("<think>\nThe user greets me.\n</think>\n\nHello!", "\nThe user greets me.\n", "Hello!"),
        ("<think>\n\n</think>\n\nHi.", "\n\n", "Hi."),  # thinking switched off: an empty block
        ("Hello, no thinking here.", "", "Hello, no thinking here."),
        ("<think>cut off while thinking", "cut off while thinking", ""),
        ("Use <think> tags like this.", "", "Use <think> tags like this."),  # not at the start: content
    ],
    "deepseek_r1": [
        ("Let me think. 2+2=4.\n</think>\n\nThe answer is 4.", "Let me think. 2+2=4.\n", "The answer is 4."),
        ("<think>Opened again.</think>Done.", "Opened again.", "Done."),
        ("still thinking when max_tokens hit", "still thinking when max_tokens hit", ""),
    ],
}


def run(name: str, pieces: list[str]) -> tuple[str, str]:
    p = parsers.reasoning_parser(name)()
    reasoning = content = ""
    for piece in pieces:
        r, c = p.feed(piece)
        reasoning, content = reasoning + r, content + c
    r, c = p.finish()
    return reasoning + r, content + c


@pytest.mark.parametrize("name", sorted(CASES))
def test_whole_and_streamed(name):
    rng = random.Random(random.SystemRandom().randrange(2**32))
    for text, reasoning, content in CASES[name]:
        assert run(name, [text]) == (reasoning, content), text
        for _ in range(30):
            cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, min(10, len(text) - 1))))
            pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
            assert run(name, pieces) == (reasoning, content), pieces


def test_the_closing_tag_is_never_streamed_as_reasoning():
    p = parsers.reasoning_parser("qwen3")()
    assert p.feed("<think>abc</th") == ("abc", "")
    assert p.feed("ink>xyz") == ("", "xyz")
