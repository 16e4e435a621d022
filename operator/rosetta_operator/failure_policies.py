"""What a failure does to a training: the gang Job's pod failure policy and the JobSet's failure
policy. A preemption restarts the gang without using up maxRestarts; a failure class the spec fails
at once, or a stage job refused its source, fails the training; anything else restarts and counts.
"""

from __future__ import annotations

from typing import Any, Optional

from rosetta_contract.failures import CLASS_EXITS, FAIL
from rosetta_contract.spec import TranslationTrainingSpec
from rosetta_operator.names import DISRUPTION_TARGET, REPLICATED_JOB, STAGE_JOB, TRAINER_CONTAINER
from rosetta_operator.stage_job import has_stage_job

# A pod the cluster took away (names.DISRUPTION_TARGET) fails its Job, by the Job's pod failure
# policy, with this reason, and the JobSet's rule of this name restarts the gang without counting it.
POD_FAILURE_POLICY_REASON = "PodFailurePolicy"
PREEMPTION_RULE = "preemption"
FAIL_FAST_RULE = "fail_fast"
PREEMPTION_ACTION = "RestartJobSetAndIgnoreMaxRestarts"
# JobSet's webhook: a letter, then letters, digits, "_", "," or ":" (no "-").
STAGE_REFUSED_RULE = "stage_refused"


def fail_fast_exit_codes(spec: TranslationTrainingSpec) -> list[int]:
    """The trainer's exit codes (failures.CLASS_EXITS, through rosetta_trainer.launch) whose class the
    spec fails at once (failurePolicy.actions)."""
    actions = spec.failure_policy.actions
    return sorted(code for cls, code in CLASS_EXITS.items() if actions.action(cls) == FAIL)


def pod_failure_policy(spec: TranslationTrainingSpec) -> dict[str, Any]:
    """A pod the cluster took away fails its Job at once, with a reason the JobSet can tell apart;
    so does a trainer that exits with a class the spec fails at once, whose message (the Job
    controller's "Container trainer for pod ... failed with exit code N matching FailJob rule")
    the JobSet's fail-fast rule tells apart from a preemption."""
    rules: list[dict[str, Any]] = [{"action": "FailJob",
                                    "onPodConditions": [{"type": DISRUPTION_TARGET, "status": "True"}]}]
    codes = fail_fast_exit_codes(spec)
    if codes:
        rules.append({"action": "FailJob",
                      "onExitCodes": {"containerName": TRAINER_CONTAINER, "operator": "In", "values": codes}})
    return {"rules": rules}


def fail_fast_rule(spec: TranslationTrainingSpec) -> Optional[dict[str, Any]]:
    """The JobSet rule that fails the training, instead of restarting it, when the gang's Job failed
    on one of fail_fast_exit_codes."""
    codes = fail_fast_exit_codes(spec)
    if not codes:
        return None
    pattern = (f"^Container {TRAINER_CONTAINER} for pod \\S+ failed with exit code "
               f"({'|'.join(map(str, codes))}) matching FailJob rule")
    return {"name": FAIL_FAST_RULE, "action": "FailJobSet", "onJobFailureReasons": [POD_FAILURE_POLICY_REASON],
            "onJobFailureMessagePatterns": [pattern], "targetReplicatedJobs": [REPLICATED_JOB]}


def failure_policy(spec: TranslationTrainingSpec) -> dict[str, Any]:
    """Preemption restarts the gang without using up maxRestarts; any other failure falls through
    to the JobSet's default, RestartJobSet, which counts. With a stage job, its pod failure policy
    fails it for a source that is not there: that fails the JobSet at once (no rule sees it as a
    preemption, and a restart would only ask again)."""
    rules: list[dict[str, Any]] = [{"name": PREEMPTION_RULE, "action": PREEMPTION_ACTION,
                          "onJobFailureReasons": [POD_FAILURE_POLICY_REASON]}]
    if has_stage_job(spec):
        rules = [{"name": STAGE_REFUSED_RULE, "action": "FailJobSet", "onJobFailureReasons": [POD_FAILURE_POLICY_REASON],
                  "targetReplicatedJobs": [STAGE_JOB]},
                 {**rules[0], "targetReplicatedJobs": [REPLICATED_JOB]}]
    fail_fast = fail_fast_rule(spec)
    if fail_fast is not None:
        rules.insert(0, fail_fast)  # first: the preemption rule matches the same reason
    return {"maxRestarts": spec.failure_policy.max_restarts, "rules": rules}
