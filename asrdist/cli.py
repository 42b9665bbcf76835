"""`asrdist` command line: one sub-command per pipeline stage, each runnable alone."""
from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
import warnings

from asrdist.errors import AsrdistError

# Each module exposes register(subparsers); the parser it adds sets `func(args) -> int | None`.
COMMAND_MODULES = (
    "asrdist.corpus.cli",
    "asrdist.features.cli",
    "asrdist.run.train_cli",
    "asrdist.run.prepare_cli",
    "asrdist.run.eval_cli",
    "asrdist.run.align_cli",
    "asrdist.bench.cli",
    "asrdist.compare.cli",
    "asrdist.topology_cli",
    "asrdist.sim.cli",
    "asrdist.demo",
)

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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="asrdist", description="Data-parallel training of speech acoustic models.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


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
    parser = build_parser()
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


if __name__ == "__main__":
    sys.exit(main())
