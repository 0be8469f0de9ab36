"""The generated reference pages equal what the code declares: docs/reference/flags.md (the
click commands) and docs/reference/environment.md (core.envs) are regenerated and compared
with the committed files, and the generator leaves out no flag and no variable."""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path

import click
import pytest

from core import docs_reference, envs
from core.docs_reference import REGENERATE, flags_page, reference_pages, stale_pages
from core.entrypoints.cli import cli

REFERENCE_DIR = Path(__file__).resolve().parents[1] / "docs" / "reference"


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return reference_pages()


@pytest.mark.parametrize("name", ["flags.md", "environment.md"])
def test_committed_reference_page_equals_the_regenerated_one(pages, name):
    committed = REFERENCE_DIR / name
    assert committed.is_file() and committed.read_text() == pages[name], (
        f"docs/reference/{name} is out of date: run `{REGENERATE}` at the repository root"
    )


def test_flags_page_lists_every_option_of_every_command(pages):
    def options(command: click.Command):
        yield from (p for p in command.params if isinstance(p, click.Option))
        if isinstance(command, click.Group):
            for sub in command.commands.values():
                yield from options(sub)

    missing = {
        name
        for option in options(cli)
        for name in [*option.opts, *option.secondary_opts]
        if f"`{name}`" not in pages["flags.md"]
    }
    assert not missing


def test_environment_page_has_a_section_for_every_variable_envs_reads(pages):
    source = inspect.getsource(envs)
    variables = set(re.findall(r'environ\.get\("(CORE_[A-Z_]+)"', source))
    assert variables, "core.envs reads no CORE_ variable through os.environ.get"
    headings = set(re.findall(r"^## (\S+)$", pages["environment.md"], re.MULTILINE))
    assert variables <= headings


def machine_threads() -> int:
    return os.cpu_count() or 1


def test_a_callable_default_is_shown_by_its_name_never_by_this_machines_value():
    @click.group()
    def group() -> None:
        pass

    @group.command()
    @click.option("--threads", type=int, default=machine_threads, help="worker threads")
    def work(threads: int) -> None:
        pass

    # The engine section needs the two engine commands; here they have no shared options.
    group.add_command(click.Command("serve"))
    group.add_command(click.Command("generate"))
    page = flags_page(group)
    row = next(line for line in page.splitlines() if line.startswith("| `--threads`"))
    assert row == "| `--threads` | integer | `machine_threads()` | worker threads |"


def test_stale_pages_names_each_page_that_is_missing_or_differs(tmp_path, pages):
    for name, text in pages.items():
        (tmp_path / name).write_text(text)
    assert stale_pages(tmp_path) == []
    (tmp_path / "flags.md").write_text(pages["flags.md"] + "edited by hand\n")
    (tmp_path / "environment.md").unlink()
    assert stale_pages(tmp_path) == ["flags.md", "environment.md"]


def test_main_writes_the_pages_and_check_then_passes(tmp_path, monkeypatch, pages):
    monkeypatch.chdir(tmp_path)
    assert docs_reference.main(["--check"]) == 1
    assert docs_reference.main([]) == 0
    assert (tmp_path / "docs/reference/flags.md").read_text() == pages["flags.md"]
    assert docs_reference.main(["--check"]) == 0
