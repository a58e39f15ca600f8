"""The README's promises match the code."""
from __future__ import annotations

from pathlib import Path

from sparkbeam.plan.check import support_table_markdown

ROOT = Path(__file__).resolve().parents[2]


def test_readme_support_table_is_generated_from_the_registry() -> None:
    assert support_table_markdown() in (ROOT / "README.md").read_text()


def test_readme_starts_with_the_two_setup_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert text.index("make run") < text.index("make test") < text.index("## Example")
