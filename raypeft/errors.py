"""The user error every layer raises: a leaf module, so any layer can import it.

A :class:`ConfigError` is a mistake in what the user gave (an experiment file, an override, a
data file, a store URI, a resource request). Its message is one line naming the key or file and
the rule that must hold; the CLI prints it as ``error: ...`` and exits with code 2.
"""


class ConfigError(Exception):
    """A user error in an experiment file, override, data file or command line; one line."""
