"""The schedulers' clock is the trial's evaluation count, not Tune's ``training_iteration``.

A trial whose checkpoint was damaged starts over from step 0 when it is restarted
(``raypeft.training.checkpoints``), but Tune restores its ``training_iteration`` from that
checkpoint and counts on. Ray's real ``ASHAScheduler``, built by raypeft's
:func:`raypeft.search.tuner.scheduler`, is fed here the results such a trial reports (as
Tune's controller feeds them), beside the same scheduler on Tune's counter.
"""

from __future__ import annotations

from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from raypeft.config.loading import validate_experiment
from raypeft.search.simulate.replay import SimulatedController
from raypeft.search.tuner import scheduler
from raypeft.training.result_keys import EVALUATION_KEY, TRIAL_STEPS_KEY, evaluation_number

STEPS, EVERY = 80, 10  # 8 evaluations: ASHA's rungs at 1, 2 and 4 (grace 1, factor 2)
CFG = validate_experiment(
    {
        "name": "clock",
        "model": {"name": "tiny-bert", "max_length": 16},
        "method": {"name": "pt", "prompt_length": 4},
        "train": {"max_steps": STEPS, "eval_every": EVERY},
        "space": {"method.lr": {"choice": [0.1, 0.2]}},
        "search": {"scheduler": {"type": "asha", "grace_period": 1, "reduction_factor": 2}},
    },
    "clock.yaml",
)


def result(step: int, iteration: int, acc: float) -> dict:
    """What a trial reports at ``step``, as Tune hands it on: Tune's own count added."""
    return {
        "step": step,
        EVALUATION_KEY: evaluation_number(step, EVERY),
        "training_iteration": iteration,
        "best_val_accuracy": acc,
        TRIAL_STEPS_KEY: STEPS,
    }


def decisions(sched: TrialScheduler) -> list[str]:
    """Three trials run to their 4th evaluation (ASHA's third rung keeps the top half:
    0.7 and up); then a fourth that scored well for 3 evaluations, paused there, and started
    over from step 0 (its checkpoint damaged), reaching 0.3, 0.5, 0.6, 0.75, 0.8 at its
    evaluations 1-5 while Tune counts its results 4-8. Returns the fourth's decisions after
    it started over."""
    controller = SimulatedController()

    def add(trial_id: str) -> Trial:
        trial = Trial("clock", trial_id=trial_id, stub=True)
        controller.trials.append(trial)
        sched.on_trial_add(controller, trial)
        return trial

    for trial_id, accs in (("a", [0.5, 0.55, 0.6, 0.6]), ("b", [0.6, 0.65, 0.7, 0.7])):
        trial = add(trial_id)
        for k, acc in enumerate(accs, start=1):
            assert sched.on_trial_result(controller, trial, result(EVERY * k, k, acc)) == (
                TrialScheduler.CONTINUE
            )
    c = add("c")
    for k, acc in enumerate([0.7, 0.75, 0.8, 0.8], start=1):
        sched.on_trial_result(controller, c, result(EVERY * k, k, acc))
    restarted = add("restarted")
    for k, acc in enumerate([0.9, 0.9, 0.9], start=1):  # recorded at rungs 1 and 2
        assert sched.on_trial_result(controller, restarted, result(EVERY * k, k, acc)) == (
            TrialScheduler.CONTINUE
        )
    # paused at its 3rd evaluation; its checkpoint damaged, it starts over from step 0
    after = []
    for k, acc in enumerate([0.3, 0.5, 0.6, 0.75, 0.8], start=1):
        after.append(sched.on_trial_result(controller, restarted, result(EVERY * k, 3 + k, acc)))
    return after


def test_a_trial_that_started_over_meets_each_rung_at_its_own_evaluation():
    """raypeft's ASHA lets it train: its 1st-3rd evaluations meet rungs it already passed,
    and at its 4th (0.75) it is judged against the others' 4th evaluations, where it makes
    the top half. Its 5th result goes on."""
    sched = scheduler(CFG, "best_val_accuracy", "max")
    assert isinstance(sched, ASHAScheduler)
    assert decisions(sched) == [TrialScheduler.CONTINUE] * 5


def test_on_tunes_counter_the_same_trial_is_judged_at_a_rung_it_has_not_reached():
    """What the evaluation clock replaces: on ``training_iteration`` its first evaluation
    after starting over (0.3) is its 4th result, compared with the others' 4th evaluations,
    and the trial is stopped at once."""
    on_tunes_counter = ASHAScheduler(
        time_attr="training_iteration",
        metric="best_val_accuracy",
        mode="max",
        max_t=CFG.most_evaluations(),
        grace_period=1,
        reduction_factor=2,
    )
    assert decisions(on_tunes_counter)[0] == TrialScheduler.STOP


def test_evaluation_numbers_count_from_step_zero_and_include_a_last_short_one():
    assert [evaluation_number(s, 10) for s in (10, 20, 30)] == [1, 2, 3]
    assert evaluation_number(35, 10) == 4  # max_steps 35: the last evaluation, at its end
    assert CFG.most_evaluations() == evaluation_number(STEPS, EVERY)
