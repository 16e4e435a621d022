"""The operator's cost per training, without a cluster: the settings and choices that keep it low.

Each was measured (docs/benchmarks.md, "Operator at scale"); none changes what the operator does,
so nothing else would notice if one were lost.
"""

from __future__ import annotations

import copy
import inspect
import logging
from pathlib import Path

import kopf
import pytest
import yaml
from kubernetes.config import kube_config

from rosetta_contract.resource import Phase
from rosetta_contract.spec import parse_spec
from rosetta_operator import handlers
from rosetta_operator.conditions import ConditionType, condition
from rosetta_operator.render import render
from support.cel_cases import BASE, SHARED_CHECKPOINTS
from support.handler_api import NAME, memo, reconcile, training

SPEC = {**copy.deepcopy(BASE), "nodes": 2, "volumes": SHARED_CHECKPOINTS}  # the smallest valid spec on two nodes


@pytest.fixture
def configure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The startup hook, as `kopf run` calls it (its API client is never used here): memo -> settings."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "unit",
        "clusters": [{"name": "unit", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "unit", "user": {"token": "unit"}}],
        "contexts": [{"name": "unit", "context": {"cluster": "unit", "user": "unit"}}],
    }))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    memos = []

    def run(given: kopf.Memo) -> kopf.OperatorSettings:
        settings = kopf.OperatorSettings()
        handlers.configure(settings=settings, memo=given, logger=logging.getLogger(__name__))
        memos.append(given)
        return settings

    yield run
    for given in memos:
        given.api_client.close()


@pytest.fixture
def configured(configure):
    return configure(kopf.Memo())


def test_the_quota_retry_comes_from_the_flag_else_the_environment(configure, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(handlers.startup.QUOTA_RETRY_ENV, raising=False)
    configure(default := kopf.Memo())
    assert default.quota_retry == handlers.QUOTA_RETRY_DELAY == 30
    monkeypatch.setenv(handlers.startup.QUOTA_RETRY_ENV, "5")  # `kopf run`
    configure(from_env := kopf.Memo())
    assert from_env.quota_retry == 5
    configure(from_flag := kopf.Memo(quota_retry=2.5))  # `rosetta operator --quota-retry 2.5`
    assert from_flag.quota_retry == 2.5


def test_the_progress_interval_comes_from_the_flag_else_the_environment(configure, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(handlers.startup.PROGRESS_INTERVAL_ENV, raising=False)
    configure(default := kopf.Memo())
    assert default.progress_interval == handlers.startup.DEFAULT_PROGRESS_INTERVAL == 15
    monkeypatch.setenv(handlers.startup.PROGRESS_INTERVAL_ENV, "4")
    configure(from_env := kopf.Memo())
    assert from_env.progress_interval == 4
    configure(from_flag := kopf.Memo(progress_interval=2.5))
    assert from_flag.progress_interval == 2.5


@pytest.mark.parametrize("flag", ["--progress-interval", "--quota-retry"])
@pytest.mark.parametrize("value", ["0", "-3", "soon"])
def test_the_operators_intervals_refuse_what_is_not_a_positive_duration(flag, value, capsys):
    from rosetta_cli.main import main

    with pytest.raises(SystemExit) as exit_:
        main(["operator", flag, value])
    assert exit_.value.code == 2
    assert f"argument {flag}: '{value}'" in capsys.readouterr().err


def registered(handler_id: str):
    (handler,) = [h for h in kopf.get_default_registry()._watching.get_all_handlers() if h.id == handler_id]
    return handler


def test_create_handlers_wait_for_their_own_patch_under_backlog(configured):
    # kopf's default is 5 s: a watch lagging longer than that made a create handler run twice for
    # one training (1,613 reconciles for 1,001 trainings at 50/s).
    assert kopf.OperatorSettings().persistence.consistency_timeout < 60
    assert configured.persistence.consistency_timeout == 60


def test_phase_gauge_handler_runs_on_the_event_loop():
    # A sync handler would queue each of a training's events for a worker thread.
    handler = registered("count_phases")
    assert inspect.iscoroutinefunction(handler.fn)


def test_pod_events_are_filtered_on_the_event_loop():
    # Nearly every pod event says nothing new about scheduling; a sync handler would queue each.
    assert inspect.iscoroutinefunction(registered("pod_scheduling").fn)


def test_only_training_pods_and_kueue_workloads_are_watched(configured):
    # Server-side: the cluster's other pods never reach the operator (kopf's labels= filters locally).
    from kopf._cogs.structs.references import Resource
    selectors = configured.watching.label_selectors
    assert selectors.collect(Resource("", "v1", "pods")) == ["rosetta.dev/training"]
    assert selectors.collect(Resource("kueue.x-k8s.io", "v1beta1", "workloads")) == ["kueue.x-k8s.io/job-uid"]
    assert selectors.collect(Resource("jobset.x-k8s.io", "v1alpha2", "jobsets")) == []


def test_pending_trainings_are_not_scraped():
    # Not every node's job is ready, so no rank has logged a step: nothing to scrape yet.
    status, spec = {"jobSetName": "mt"}, {"metrics": {"port": 9400}}
    active = {phase for phase in (Phase.PENDING, Phase.QUEUED, Phase.RUNNING, Phase.RESTARTING, Phase.SUSPENDED,
                                  Phase.SUCCEEDED, Phase.FAILED)
              if handlers.progress_active(status={**status, "phase": phase}, spec=spec)}
    assert active == {Phase.RUNNING, Phase.RESTARTING}
    assert not handlers.progress_active(status={**status, "phase": Phase.RUNNING}, spec={"metrics": {"port": 0}})


@pytest.mark.skipif(not yaml.__with_libyaml__, reason="this PyYAML was built without libyaml")
def test_render_parses_and_writes_yaml_with_libyaml(monkeypatch: pytest.MonkeyPatch):
    # The pure-Python parser and emitter were most of a reconcile's CPU time (15 ms against 3.4 ms).
    # Every pure-Python loader reads through yaml.reader.Reader and every pure-Python dumper writes
    # through yaml.emitter.Emitter; libyaml's CSafeLoader / CSafeDumper use neither.
    pure = []
    for cls in (yaml.reader.Reader, yaml.emitter.Emitter):
        original = cls.__init__

        def spy(self, *args, _original=original, _cls=cls, **kwargs):
            pure.append(_cls.__name__)
            _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", spy)
    yaml.safe_dump(yaml.safe_load("a: 1"))
    assert pure == ["Reader", "Emitter"], "the spy does not see the pure-Python parser"
    pure.clear()

    rendered = render("mt", "team", parse_spec(SPEC))

    assert rendered.jobset["kind"] == "JobSet" and rendered.configmap["kind"] == "ConfigMap"
    assert pure == []


# ------------------------------------------------------------------------------- events
# Each is an object in etcd: one per situation, not one per retry, restart or log line.


def posted_as_event(settings: kopf.OperatorSettings, level: int) -> bool:
    """Whether kopf turns a handler's log record at `level` into an event (reason Logging)."""
    from kopf._core.engines.posting import K8sPoster

    record = logging.LogRecord("kopf.objects", level, __file__, 0, "progress: timed out", None, None)
    record.settings, record.k8s_skip = settings, False
    record.k8s_ref = {"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining", "name": "mt",
                      "namespace": "team", "uid": "uid-mt"}
    return K8sPoster().filter(record)


def test_log_lines_stay_in_the_log(configured):
    # A quota-blocked create logs each retry, the progress daemon each failed scrape.
    assert not any(posted_as_event(configured, level) for level in (logging.WARNING, logging.ERROR))
    # What kopf before 1.44 did with them: the check above would see it.
    posting_logs = kopf.OperatorSettings()
    posting_logs.posting.loggers, posting_logs.posting.level = True, configured.posting.level
    assert posted_as_event(posting_logs, logging.ERROR)
    # The explicit Warnings still go out.
    assert configured.posting.enabled and configured.posting.level <= logging.WARNING


def test_an_invalid_spec_is_one_warning_until_it_is_edited(api, warnings):
    host_path = {"name": "scratch", "mountPath": "/scratch", "hostPath": {"path": "/var/tmp"}}
    tt = training(api, volumes=[*SHARED_CHECKPOINTS, host_path])
    m = memo(api)
    for _ in range(3):  # created, then resumed by two operator restarts
        reconcile(api, m)
    assert [w["reason"] for w in warnings] == ["InvalidSpec"]
    assert "spec.volumes[1].hostPath" in warnings[0]["message"]

    tt = api.get("translationtrainings", NAME)
    tt["metadata"]["generation"] = 2  # an edit that is still invalid: the user hears of it again
    api.put("translationtrainings", tt)
    reconcile(api, m)
    assert [w["reason"] for w in warnings] == ["InvalidSpec"] * 2


def test_a_refused_spec_change_is_one_warning(api, warnings):
    training(api)
    m = memo(api)
    reconcile(api, m)
    tt = api.get("translationtrainings", NAME)
    tt["metadata"]["generation"], tt["spec"]["nodes"] = 2, 4
    api.put("translationtrainings", tt)
    for _ in range(3):
        status = reconcile(api, m)["status"]
    assert condition(status, ConditionType.SPEC_APPLIED)["reason"] == "SpecChangeRefused"
    assert [w["reason"] for w in warnings] == ["SpecChangeRefused"]
