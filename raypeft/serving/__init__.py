"""A trained trial put to use: ``predict`` (batch inference) and ``export`` (peft adapters)."""
