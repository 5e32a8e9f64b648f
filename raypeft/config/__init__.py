"""The experiment file: the pydantic schema, loading with ``--set`` overrides, error wording.

``schema`` holds the models, a module a section of the file; ``loading`` reads a file;
``method_configs`` the fields every method's config has and the registry methods add their
configs to (the config layer never imports a method); ``messages`` turns pydantic's errors
into one line naming the key and the rule; ``redact`` hides credentials before any config is
written out; ``cache_root`` is the one folder (and variable, ``RAYPEFT_CACHE_DIR``) of
everything raypeft caches on disk.
"""
