"""``python -m benchmarks.fidelity``: the command of :mod:`benchmarks.fidelity.cli`."""

from benchmarks.fidelity.cli import main

if __name__ == "__main__":
    main()
