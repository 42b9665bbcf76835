"""`asrdist` command line: one sub-command per pipeline stage, each runnable alone."""
from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
import warnings
from typing import NoReturn

from asrdist.commands import COMMANDS
from asrdist.errors import AsrdistError

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_ENVIRONMENT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors in one line, like every other asrdist error (argparse prints
    the whole usage block first); sub-command parsers are of this class too."""

    def error(self, message: str):
        self.exit(2, usage_error_line(self.prog.removeprefix("asrdist").strip(), message))


def usage_error_line(command: str, message: str) -> str:
    """The one line of a usage error of `asrdist COMMAND` (`command` "" for asrdist itself)."""
    where = f"{command}: " if command else ""
    flat = " ".join(message.split())
    return f"asrdist: error: {where}{flat} (see {' '.join(['asrdist', command]).strip()} --help)\n"


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser of the command line `argv`: every command listed, only the given command's
    module imported for its arguments (none for `asrdist --help`). `argv` None: every command's
    arguments (the whole command line, as documentation and tests read it)."""
    parser = _Parser(prog="asrdist", description="Data-parallel training of speech acoustic models.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    path = None if argv is None else command_path(argv)
    chosen = None  # every module
    if path is not None:
        chosen = COMMANDS[path[0]][0] if path and path[0] in COMMANDS else ""  # "": no module
    for name, (module, help_text) in COMMANDS.items():
        if name in sub.choices:
            continue  # registered with another command of its module (eval, decode)
        if chosen is None or module == chosen:
            importlib.import_module(module).register(sub, path)
        else:  # listed for `asrdist --help` and for a misspelt command's error; never run
            sub.add_parser(name, help=help_text)
    return parser


def command_path(argv: list[str]) -> list[str]:
    """The leading words of a command line, before its first option (`bench straggler`)."""
    path = []
    for word in argv:
        if word.startswith("-"):
            break
        path.append(word)
    return path


_default_formatwarning = warnings.formatwarning


def _format_warning(message, category, filename, lineno, line=None) -> str:
    """asrdist's own warnings as one line on the terminal (a note, not a source listing)."""
    if str(filename).startswith(_PACKAGE_DIR):
        return f"[asrdist] warning: {message}\n"
    return _default_formatwarning(message, category, filename, lineno, line)


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # anywhere, the parser's imports of torch and the rest included
        print("asrdist: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    warnings.formatwarning = _format_warning
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    # `section.key=value` overrides may follow options (asrdist train CONFIG --epochs 2 optim.lr=0.1)
    args, extra = parser.parse_known_args(argv)
    if extra:
        if hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
            args.overrides = list(args.overrides or []) + extra
        else:
            parser.exit(2, usage_error_line(args.command, f"unrecognized arguments: {' '.join(extra)}"))
    try:
        rc = args.func(args)
    except AsrdistError as exc:
        print(f"asrdist: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        # The reader of stdout went away (`asrdist decode ... | head`): stop quietly, as `cat` does,
        # with stdout pointed at /dev/null so the interpreter's last flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # the shell's status for a writer killed by SIGPIPE
    except OSError as exc:  # after BrokenPipeError, one of them
        if exc.errno not in _ENVIRONMENT_ERRNOS:
            raise
        # the machine's refusal (a full disk, a read-only or forbidden destination) where no command
        # caught it itself: one line naming the file, as for every other error
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"asrdist: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    return int(rc or 0)


def run() -> NoReturn:
    """The `asrdist` command: `main()` on sys.argv, then out without the interpreter's teardown of
    torch (`asrdist.utils.leave`; about 0.8 s of CPU per command)."""
    code = main()
    from asrdist.utils.leave import leave  # after main: `asrdist --help` imports the command table alone
    leave(code)


if __name__ == "__main__":
    run()
