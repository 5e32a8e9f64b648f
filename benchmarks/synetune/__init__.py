"""raypeft's learning-curve tables against syne-tune (issue 57): exported in its blackbox
format (:mod:`~benchmarks.synetune.export`), its baselines replayed on them through its own
simulator (:mod:`~benchmarks.synetune.baselines`) beside raypeft's shipped search replayed by
``raypeft simulate``'s machinery (:mod:`~benchmarks.synetune.raypeft_side`), both scored as
raypeft's study scores (:mod:`~benchmarks.synetune.curves`), run and stored by
:mod:`~benchmarks.synetune.study`, tabulated by :mod:`~benchmarks.synetune.report`.

syne-tune 0.16.0 (PyPI, 2026-11) pins nothing raypeft pins but pulls xgboost (and NVIDIA's
NCCL wheel), statsmodels and scikit-learn, so it lives in a venv of its own; raypeft never
imports it. Its ``serialize``/``deserialize`` need fastparquet and its ``blackbox_repository``
package imports huggingface_hub (0.16.0 has no ``blackbox-repository`` extra)::

    bash scripts/install-synetune.sh   # .venv-synetune in the checkout

Run the syne-tune half as ``PYTHONPATH=. .venv-synetune/bin/python -m
benchmarks.synetune.<module>`` from the repository root; :mod:`curves` reads raypeft's JSON
tables with numpy alone, so nothing of raypeft's is needed there.
"""
