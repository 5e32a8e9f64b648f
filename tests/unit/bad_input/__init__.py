"""Bad input, by theme: each module's cases run through ``raypeft tune`` and ``validate``."""
