"""The manual's command lines are asrdist's: every `asrdist ...` line that README.md and docs/*.md
show in a code block is checked against asrdist's own parser (its sub-command exists, every flag
it shows belongs to that sub-command, and a line without placeholders parses as a whole), and every
`make TARGET` they name is a target of the Makefile. Nothing is run: the parser is built in this
process and the command's action is never called, so this stays in the quick loop."""
from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from asrdist.cli import build_parser, main
from tests.support.paths import ROOT

DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# what may stand before `asrdist` on a shell line: environment settings and wrappers that pass
# the rest of the line through unchanged
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_WRAPPERS = {"nice", "-n", "nohup", "time", "/usr/bin/time", "-v", "sudo", "exec", "env"}


def is_synopsis(argv) -> bool:
    """A synopsis line (`[--opt N]`, `a|b`, `...`): its flags are checked, the whole line is not
    parsed (placeholders such as N stand where a number goes). `key=[3]` is a value, not a mark."""
    return any(t == "|" or "..." in t or "…" in t or ("=" not in t and re.search(r"[\[\]|]", t))
               for t in argv)


@dataclass(frozen=True)
class DocCommand:
    where: str  # FILE:LINE
    text: str  # the line as shown, continuations joined
    argv: tuple[str, ...]  # what follows `asrdist`

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


def _code_blocks(text: str):
    """(first line number, body) of every fenced code block."""
    for m in re.finditer(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M):
        yield text.count("\n", 0, m.start(1)) + 1, m.group(1)


def _logical_lines(first: int, body: str):
    """(line number, line) with backslash continuations joined and a `$ ` prompt taken off."""
    pending, start = "", first
    for number, raw in enumerate(body.split("\n"), first):
        if not pending:
            start = number
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = (pending + raw).strip()
        pending = ""
        if line.startswith("$ "):
            line = line[2:]
        yield start, line


def asrdist_argv(line: str) -> list[str] | None:
    """The arguments after `asrdist` (or `.venv/bin/asrdist`, `python -m asrdist`) on a shell line,
    comments dropped; None where the line does not run asrdist."""
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:
        return None
    for i, token in enumerate(tokens):
        if token == "asrdist" or token.endswith("/asrdist"):
            return tokens[i + 1:]
        if token.endswith("python") or token.endswith("python3"):
            if tokens[i + 1:i + 3] == ["-m", "asrdist"]:
                return tokens[i + 3:]
            return None
        if not (_ENV.match(token) or token in _WRAPPERS or token.isdigit()):
            return None
    return None


def doc_commands(text: str, name: str) -> list[DocCommand]:
    """Every asrdist command line in the code blocks of one markdown text."""
    found = []
    for first, body in _code_blocks(text):
        for number, line in _logical_lines(first, body):
            argv = asrdist_argv(line)
            if argv is not None:
                found.append(DocCommand(f"{name}:{number}", line, tuple(argv)))
    return found


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _command_parser(root: argparse.ArgumentParser, argv: list[str]):
    """(parser of the sub-command argv names, the sub-command words, the rest), or a problem."""
    parser, path = root, []
    rest = list(argv)
    while True:
        subs = _subparsers(parser)
        if not subs:
            return parser, path, rest
        if not rest:
            return f"`asrdist {' '.join(path)}` needs a sub-command (one of {', '.join(subs)})"
        if rest[0] not in subs:
            return f"`asrdist {' '.join(path + [rest[0]])}`: no such command (one of {', '.join(subs)})"
        path.append(rest.pop(0))
        parser = subs[path[-1]]


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def check_command(root: argparse.ArgumentParser, command: DocCommand, whole: bool = True) -> list[str]:
    """What is wrong with one documented command line ([] when nothing). With `whole` false (a
    command named in running text, often only a sub-command and the one flag a sentence is about),
    only its sub-command and the names of its flags are checked."""
    found = _command_parser(root, list(command.argv))
    if isinstance(found, str):
        # running text may name a command group alone (`asrdist bench`) or a placeholder for any
        if not whole and re.search(r"needs a sub-command|`asrdist (?:\S+ )*[A-Z][A-Z_]*`", found):
            return []
        return [found]
    parser, path, rest = found
    where = f"`asrdist {' '.join(path)}`"
    problems = []
    options = parser._option_string_actions
    tokens = [t.strip("[]") for t in rest]
    for i, token in enumerate(tokens):
        if not re.match(r"^--?[A-Za-z]", token):
            continue
        flag, eq, _ = token.partition("=")
        action = options.get(flag)
        if action is None:
            problems.append(f"{where} has no option {flag}")
            continue
        if whole and _takes_value(action) and not eq:
            following = tokens[i + 1] if i + 1 < len(tokens) else ""
            if following in ("", "|") or re.match(r"^--?[A-Za-z]", following):
                problems.append(f"{where}: {flag} needs a value, the line shows none")
    if problems or not whole or is_synopsis(rest):
        return problems
    # a line without placeholders' marks: asrdist's own parser takes it whole, as `main` would
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args, extra = root.parse_known_args(list(command.argv))
    except SystemExit:
        return [f"{where} refuses it: {stderr.getvalue().strip()}"]
    if extra and not (hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra)):
        return [f"{where}: unrecognized arguments: {' '.join(extra)}"]
    if not callable(getattr(args, "func", None)):
        return [f"{where} has no action"]
    return []


def _all_doc_commands() -> list[DocCommand]:
    found = []
    for path in DOC_FILES:
        found += doc_commands(path.read_text(), str(path.relative_to(ROOT)))
    return found


def inline_commands(text: str, name: str) -> list[DocCommand]:
    """Every `asrdist SUB ...` named in running text (inline code outside code blocks)."""
    prose = re.sub(r"^```[^\n]*\n.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)
    found = []
    for m in re.finditer(r"`((?:\.venv/bin/)?asrdist [^`\n]+)`", prose):
        argv = asrdist_argv(m.group(1))
        if argv:
            found.append(DocCommand(f"{name}:{prose.count(chr(10), 0, m.start()) + 1}", m.group(1), tuple(argv)))
    return found


DOC_COMMANDS = _all_doc_commands()
INLINE_COMMANDS = [c for path in DOC_FILES
                   for c in inline_commands(path.read_text(), str(path.relative_to(ROOT)))]


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


def test_the_docs_show_commands():
    """The extraction finds the manual's commands (a broken extractor would pass everything)."""
    shown = {c.argv[0] for c in DOC_COMMANDS if c.argv}
    assert {"corpus", "features", "train", "compare", "eval", "decode", "align", "bench", "simulate",
            "prepare", "topology"} <= shown
    assert any(c.where.startswith("README.md:") for c in DOC_COMMANDS)


@pytest.mark.parametrize("command", DOC_COMMANDS, ids=lambda c: c.where)
def test_documented_command_is_accepted(parser, command):
    assert check_command(parser, command) == [], str(command)


@pytest.mark.parametrize("command", INLINE_COMMANDS, ids=lambda c: c.where)
def test_command_named_in_text_exists(parser, command):
    assert check_command(parser, command, whole=False) == [], str(command)


def _command_paths(parser: argparse.ArgumentParser, prefix=()):
    for name, sub in _subparsers(parser).items():
        yield prefix + (name,)
        yield from _command_paths(sub, prefix + (name,))


def test_every_command_has_help(parser, capsys):
    """`asrdist COMMAND --help` (and each `asrdist corpus|bench SUB --help`) prints its usage, exit 0."""
    paths = list(_command_paths(parser))
    assert {("train",), ("corpus", "synth"), ("bench", "comm")} <= set(paths)
    for path in paths:
        with pytest.raises(SystemExit) as stop:
            main([*path, "--help"])
        out = capsys.readouterr().out
        assert stop.value.code == 0, path
        assert out.startswith(f"usage: asrdist {' '.join(path)}"), (path, out[:200])


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.M)}


def make_targets_named(text: str) -> set[str]:
    """The targets of `make TARGET` in inline code and of code-block lines that start with make."""
    spans = re.findall(r"`([^`\n]+)`", text)
    for _, body in _code_blocks(text):
        spans += body.split("\n")
    return {m.group(1) for span in spans if (m := re.match(r"\s*(?:\$ )?make ([a-z][\w-]*)", span))}


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: p.name)
def test_make_targets_named_exist(path):
    named = make_targets_named(path.read_text())
    assert named - _make_targets() == set(), path.name


def test_readme_names_the_two_commands():
    assert {"demo", "test"} <= make_targets_named((ROOT / "README.md").read_text())


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_links(path: Path) -> list[str]:
    """Relative links of a page whose file or #anchor does not exist."""
    text = path.read_text()
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        page = (path.parent / file).resolve() if file else path
        if not page.exists():
            broken.append(target)
        elif anchor and page.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M), re.M)
            if anchor not in {_slug(h) for h in headings}:
                broken.append(target)
    return broken


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: p.name)
def test_links_lead_somewhere(path):
    assert broken_links(path) == []


# ---- the checks can fail ---------------------------------------------------------------------

BAD_DOC = """Some prose `asrdist train --not-checked-here`.

```sh
$ asrdist train configs/default.yaml --learners 2 --no-such-flag 3     # a made-up flag
.venv/bin/asrdist corpus synth OUT [--utterances N] [--made-up-option X]
asrdist frobnicate --json OUT
asrdist eval runs/r --data corpus --learners 4                           # train's flag, not eval's
asrdist topology --learners sixteen
asrdist bench comm --json
asrdist train configs/default.yaml \\
    --strategy sync --nodes-wrong 2
```
"""

GOOD_DOC = """```sh
$ .venv/bin/asrdist train configs/default.yaml --learners 2 --strategy sync optim.lr=0.1   # fine
OMP_NUM_THREADS=1 nice -n 5 asrdist corpus synth OUT [--utterances N] [--synthesizer espeak|flite]
python -m asrdist topology --learners 16 --pattern random \\
    --json topo.json
torchrun --nnodes 2 -m asrdist.run.worker RUN   # not an asrdist command line
```
"""


def test_made_up_lines_fail(parser):
    commands = doc_commands(BAD_DOC, "bad.md")
    assert [c.where for c in commands] == [f"bad.md:{n}" for n in (4, 5, 6, 7, 8, 9, 10)]
    problems = {c.where: check_command(parser, c) for c in commands}
    assert "has no option --no-such-flag" in " ".join(problems["bad.md:4"])
    assert "has no option --made-up-option" in " ".join(problems["bad.md:5"])
    assert "no such command" in " ".join(problems["bad.md:6"])
    assert "`asrdist eval` has no option --learners" in " ".join(problems["bad.md:7"])
    assert "refuses it" in " ".join(problems["bad.md:8"])  # not a number: the parser's own check
    assert "--json needs a value" in " ".join(problems["bad.md:9"])
    assert "has no option --nodes-wrong" in " ".join(problems["bad.md:10"])


def test_made_up_flag_in_running_text_fails(parser):
    commands = inline_commands(BAD_DOC, "bad.md")
    assert [(c.where, c.argv) for c in commands] == [("bad.md:1", ("train", "--not-checked-here"))]
    assert check_command(parser, commands[0], whole=False) == ["`asrdist train` has no option --not-checked-here"]
    named = inline_commands("`asrdist train --nodes`, `asrdist bench compare --train`, `asrdist bench`,"
                            " `asrdist COMMAND --help` but `asrdist frobnicate`", "ok.md")
    assert [bool(check_command(parser, c, whole=False)) for c in named] == [False, False, False, False, True]


def test_good_lines_pass(parser):
    commands = doc_commands(GOOD_DOC, "good.md")
    assert [c.argv[:2] for c in commands] == [("train", "configs/default.yaml"), ("corpus", "synth"),
                                              ("topology", "--learners")]
    assert commands[2].argv[-2:] == ("--json", "topo.json")  # the continuation joined
    assert {c.where: check_command(parser, c) for c in commands} == {c.where: [] for c in commands}


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A `title`: here\n\n[ok](#a-title-here) [no](#nowhere) [gone](missing.md) [web](https://x.org)\n")
    assert broken_links(page) == ["#nowhere", "missing.md"]


def test_a_make_target_that_does_not_exist_is_found():
    text = "run `make demo`, then make them all\n```sh\nmake frobnicate   # a made-up target\n```\n"
    assert make_targets_named(text) == {"demo", "frobnicate"}
    assert make_targets_named(text) - _make_targets() == {"frobnicate"}
