"""`scalelab --help` and every command's and sub-command's `--help` say what each option does: a walk
over the parser (every visible command, each built as `scalelab <cmd>` builds it, and every
sub-command such as `sweep submit` or `bench mfu`) that names each option without a help text."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from scalelab.cli import COMMANDS, build_parser, main

VISIBLE = [name for name, (_, text) in COMMANDS.items() if text]


def subparsers(parser: argparse.ArgumentParser) -> list[argparse._SubParsersAction]:
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]


def undocumented(parser: argparse.ArgumentParser, path: str) -> list[str]:
    """'<path> <option>' for each option of `parser` and of its sub-commands, at any depth, with no
    help text (hidden options, help=SUPPRESS, count as documented: --help does not show them)."""
    missing = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.help == argparse.SUPPRESS:
            continue
        if not (action.help or "").strip():
            missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    for sub in subparsers(parser):
        for name, child in sub.choices.items():
            missing += undocumented(child, f"{path} {name}")
    return missing


def command_parser(name: str) -> argparse.ArgumentParser:
    """`scalelab <name>`'s parser, with its arguments (build_parser adds only the named command's)."""
    (top,) = subparsers(build_parser([name]))
    return top.choices[name]


def all_undocumented() -> list[str]:
    missing = undocumented(build_parser([]), "scalelab")
    for name in VISIBLE:
        missing += undocumented(command_parser(name), f"scalelab {name}")
    return missing


def test_every_option_of_every_visible_command_has_a_help_text():
    missing = all_undocumented()
    assert not missing, f"{len(missing)} option(s) without a help text:\n" + "\n".join(missing)


def test_the_walk_finds_every_sub_command():
    # the walk reaches the nested parsers (a walk that stopped at the commands would pass vacuously)
    sweep = command_parser("sweep")
    (actions,) = subparsers(sweep)
    assert {"submit", "status", "collect"} <= set(actions.choices)
    (benches,) = subparsers(command_parser("bench"))
    assert {"mfu", "search", "all"} <= set(benches.choices)
    bare = argparse.ArgumentParser()
    bare.add_subparsers().add_parser("inner").add_argument("--bare")
    assert undocumented(bare, "x") == ["x inner --bare"]


def help_text(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0, argv
    return out.getvalue()


def sub_commands(name: str) -> list[list[str]]:
    return [[name, sub] for action in subparsers(command_parser(name)) for sub in action.choices]


@pytest.mark.parametrize("name", VISIBLE)
def test_each_commands_help_exits_0(name):
    assert "usage: scalelab" in help_text([name, "--help"])
    for argv in sub_commands(name):
        assert f"usage: scalelab {' '.join(argv)}" in help_text([*argv, "--help"])


def test_the_top_level_help_exits_0_and_lists_the_commands():
    text = help_text(["--help"])
    assert all(name in text for name in VISIBLE)
