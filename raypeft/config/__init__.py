"""The experiment file: the pydantic schema, loading with ``--set`` overrides, error wording.

``schema`` holds the models and loading; ``messages`` turns pydantic's errors into one line
naming the key and the rule; ``redact`` hides credentials before any config is written out.
"""
