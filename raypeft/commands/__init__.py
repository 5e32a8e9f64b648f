"""Commands that read a finished search back from MLflow: report, ui, predict, export.

Each module defines click command(s) that ``raypeft.cli`` registers; heavy imports stay inside
the functions so ``raypeft --help`` stays fast.
"""
