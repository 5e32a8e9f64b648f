"""IDPG (Wu et al. 2022): a generator maps each input's sentence encoding to its prompt.

``method`` holds the config, module, count and budget; ``phm`` the parameterized hypercomplex
layers; ``sentence_encoders`` the task-agnostic M(x) computed once per example.
"""

from raypeft.methods.idpg import method  # noqa: F401  (registers the method)
