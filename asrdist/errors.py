"""The one exception type users see: a one-line message naming what and where."""


class AsrdistError(Exception):
    """Bad input or a failed run. The CLI prints `asrdist: error: <message>` and exits non-zero.

    Messages are one line and name the file / utterance / key and the reason, e.g.
    ``"corpus/train/wav.scp: utterance spk1-003: sample rate 8000 Hz, expected 16000 Hz"``.
    """

    exit_code = 2


class DataError(AsrdistError):
    """Bad corpus data: audio, transcripts, alignments, features."""


class ConfigError(AsrdistError):
    """Bad configuration: unknown key, wrong type, invalid value."""


class TrainingError(AsrdistError):
    """A run that cannot go on: NaN loss, a dead learner, a collective timeout."""


class Stopped(TrainingError):
    """A run stopped by a signal (Ctrl-C, `kill`, a closed terminal): the user's wish, not a failure,
    so a command running several trainings (`asrdist compare`) stops as a whole."""


class CommError(TrainingError):
    """A collective or exchange that failed: a peer died, hung past the timeout, or closed the link."""


class OutputError(AsrdistError):
    """Output that cannot be written: a full disk, a read-only file system, no permission."""
