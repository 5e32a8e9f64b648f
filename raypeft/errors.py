"""The user error every layer raises: a leaf module, so any layer can import it.

A :class:`ConfigError` is a mistake in what the user gave (an experiment file, an override, a
data file, a store URI, a resource request). Its message is one line naming the key or file and
the rule that must hold; the CLI prints it as ``error: ...`` and exits with code 2.
"""

from __future__ import annotations


class ConfigError(Exception):
    """A user error in an experiment file, override, data file or command line; one line."""


class DamagedArtefact(ConfigError):
    """A trained artefact that is missing, or whose bytes no longer match the digest recorded
    when it was written (a truncated upload, a bad disk, a save cut off midway); one line
    naming the file and what is wrong, exit code 2 like every user-facing error.

    ``name``: the file within its folder (``trainable.safetensors``), ``problem``: what is
    wrong with it; callers that know where the folder came from (an MLflow run's artefacts)
    say so with :meth:`located`."""

    def __init__(self, folder: object, name: str, problem: str):
        super().__init__(f"{folder}/{name}: {problem}")
        self.name, self.problem = name, problem

    def located(self, where: str) -> DamagedArtefact:
        """The same fault, the file named as ``where`` knows it (e.g. ``run R: model``)."""
        return DamagedArtefact(where, self.name, self.problem)
