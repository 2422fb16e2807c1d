"""The one base class of errors that are the user's to fix (a bad config, bad data, a missing file).

``npr`` prints such an error as one line (it names the file and the key) and exits with status 2; any
other exception is a bug and keeps its traceback. Each domain's error derives from ``UserError`` and from
the built-in class callers already catch (``ValueError``, ``RuntimeError``).
"""

from __future__ import annotations


class UserError(Exception):
    """Input the user must fix; the message says what and where (file, key, line)."""
