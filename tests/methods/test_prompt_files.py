"""Prompt templates filled from pieces found once: the text and the errors of `string.Template.substitute`."""

from __future__ import annotations

import random
from string import Template

import pytest

from rcarun.methods.prompt_files import PromptTemplate, load_prompt

_PIECES = [
    "$",
    "$$",
    "{",
    "}",
    "a",
    "b",
    "_",
    "1",
    " ",
    "\n",
    "é",
    "${a}",
    "$a",
    "$b1",
    "${",
    "$_x",
    "${ b}",
    "$A",
]
_NAMES = {"a": "X", "b": 1, "b1": "Y", "_x": "Z", "A": "W", "_": "U", "a1": "V"}


def _filled(template: Template, **names: object) -> tuple[str, str]:
    try:
        return "text", template.substitute(**names)
    except (KeyError, ValueError) as error:
        return type(error).__name__, str(error)


@pytest.mark.parametrize("seed", range(3))
def test_random_templates_fill_as_string_template_does(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(4_000):
        text = "".join(rng.choice(_PIECES) for _ in range(rng.randrange(14)))
        names = dict(rng.sample(sorted(_NAMES.items()), rng.randrange(len(_NAMES) + 1)))
        assert _filled(PromptTemplate(text), **names) == _filled(Template(text), **names), text


def test_a_mapping_argument_is_still_accepted() -> None:
    template = PromptTemplate("$who broke step $step")
    assert template.substitute({"who": "Coder", "step": 2}) == "Coder broke step 2"
    assert template.substitute({"who": "Coder"}, step=3) == "Coder broke step 3"


def test_the_bundled_prompts_fill_as_before() -> None:
    names = {
        "task": "Find $5 (the price)",
        "ground_truth": "",
        "agents": "Planner, Coder",
        "n_steps": 3,
        "step_format": "Each step is shown as ...",
        "log": "[step 0] Planner: ${not a placeholder}",
        "truncation_note": "",
        "schema": '{"type": "object"}',
    }
    prompt = load_prompt("all_at_once_user.txt")
    assert prompt.substitute(**names) == Template(prompt.template).substitute(**names)
