"""The chart's PrometheusRule, rendered by Helm's engine: every alert waits (`for`), links its section
of docs/runbooks.md, and queries only metrics the trainer and the operator really serve; Prometheus'
own promtool checks the rules and runs alert_rules_test.yaml against them."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from support.chart import CHART, MONITORING_APIS, REPO, render

RUNBOOKS = REPO / "docs" / "runbooks.md"
RULE_TESTS = Path(__file__).with_name("alert_rules_test.yaml")
NODE_PACKAGES = REPO / "tests" / "envtest" / "node-packages.sh"
DEFAULT_BASE = yaml.safe_load((CHART / "values.yaml").read_text())["monitoring"]["prometheusRule"]["runbookBaseUrl"]
ALL_ON = {"monitoring": {"prometheusRule": {"enabled": True}, "serviceMonitor": {"enabled": True}}}
ALERTS = {"RosettaTrainingNoProgress", "RosettaTrainingLossNaN", "RosettaTrainingRestarting",
          "RosettaTrainingRestartsBurning", "RosettaTrainingFailed", "RosettaTrainingStalled", "RosettaAttemptsFailing",
          "RosettaNodeExcluded", "RosettaOperatorDown"}


def rule_groups(values: dict = ALL_ON) -> list[dict]:
    (rule,) = [o for o in render(values, api_versions=MONITORING_APIS) if o["kind"] == "PrometheusRule"]
    return rule["spec"]["groups"]


def rules(values: dict = ALL_ON) -> dict[str, dict]:
    return {r["alert"]: r for group in rule_groups(values) for r in group["rules"]}


def github_anchor(heading: str) -> str:
    """The id GitHub gives a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def runbook_anchors() -> set[str]:
    return {github_anchor(m) for m in re.findall(r"^#{1,6} (.+)$", RUNBOOKS.read_text(), re.M)}


# PromQL words that are not metric names.
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "by", "without", "on", "ignoring",
            "group_left", "group_right"}


def metric_names(expr: str) -> set[str]:
    """The metric identifiers of a PromQL expression: strings, label matchers, ranges and grouping
    clauses removed, then every identifier that is neither a function (followed by `(`) nor a keyword."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    return {m.group(1) for m in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()", expr)
            if m.group(1).lower() not in KEYWORDS}


def test_metric_name_parser():
    assert metric_names('max by (namespace, training) (max_over_time(rosetta_step{phase="train"}[15m])) '
                        '- on (a) group_left (b) rosetta_total_steps > 0 and abs(x:y) == +Inf') == {
        "rosetta_step", "rosetta_total_steps", "x:y"}


def test_every_alert_waits_and_links_its_runbook_section():
    found = rules()
    assert set(found) == ALERTS
    anchors = runbook_anchors()
    for name, rule in found.items():
        assert rule.get("for"), f"{name} has no `for`"
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        url = rule["annotations"]["runbook_url"]
        base, _, anchor = url.partition("#")
        assert base == DEFAULT_BASE and anchor == name.lower(), url
        assert anchor in anchors, f"docs/runbooks.md has no section {name}"
    # ... and the page has a section for each alert, no more.
    sections = {github_anchor(h) for h in re.findall(r"^## (.+)$", RUNBOOKS.read_text(), re.M)}
    assert sections == {a.lower() for a in ALERTS}


def test_default_runbook_url_is_the_page_in_the_repository():
    home = yaml.safe_load((CHART / "Chart.yaml").read_text())["home"]
    assert DEFAULT_BASE == f"{home}/blob/main/{RUNBOOKS.relative_to(REPO)}"


def test_runbook_base_url_is_a_value():
    values = {"monitoring": {"prometheusRule": {"enabled": True, "runbookBaseUrl": "https://wiki.example/rosetta/"}}}
    for name, rule in rules(values).items():
        assert rule["annotations"]["runbook_url"] == f"https://wiki.example/rosetta#{name.lower()}"


def test_operator_down_comes_with_the_service_monitor_and_names_its_job():
    assert "RosettaOperatorDown" not in rules({"monitoring": {"prometheusRule": {"enabled": True}}})
    objects = render({**ALL_ON, "monitoring": {**ALL_ON["monitoring"], "prometheusRule": {
        "enabled": True, "operatorDownFor": "7m"}}}, api_versions=MONITORING_APIS, release="ops", namespace="infra")
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    down = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}["RosettaOperatorDown"]
    (service,) = [o for o in objects if o["kind"] == "Service"]
    # The Prometheus operator names a ServiceMonitor's job after the Service.
    assert f'up{{job="{service["metadata"]["name"]}", namespace="infra"}}' in down["expr"]
    assert down["for"] == "7m"


def test_no_progress_allows_pauses_as_values():
    values = {"monitoring": {"prometheusRule": {"enabled": True, "noProgressMinutes": 20, "pauseMinutes": 90}}}
    expr = rules(values)["RosettaTrainingNoProgress"]["expr"]
    assert 'rosetta_phase{phase="train"}[20m]' in expr and "rosetta_step[90m]" in expr


def test_every_metric_in_the_alerts_is_served(tmp_path):
    """Each name against what the endpoints really register: the trainer's Telemetry on a port,
    the operator's prometheus_client registry; `up` is Prometheus' own."""
    import urllib.request

    from prometheus_client import REGISTRY
    from prometheus_client.parser import text_string_to_metric_families

    from rosetta_operator import handlers  # noqa: F401  registers the operator's metrics
    from rosetta_operator.local.pods import free_port
    from rosetta_trainer.telemetry.telemetry import Telemetry

    used = set().union(*(metric_names(r["expr"]) for r in rules().values()))
    assert {"rosetta_step", "rosetta_phase", "rosetta_operator_training_restarts", "up"} <= used

    port = free_port()
    t = Telemetry(tmp_path, name="x", namespace="y", port=port, tensorboard=False, enabled=True)
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        t.close()
    def names(families) -> set[str]:  # a counter's family is named without the _total its samples have
        return {n for f in families for n in ((f.name, f.name + "_total") if f.type == "counter" else (f.name,))}

    trainer = names(text_string_to_metric_families(text))
    operator = names(REGISTRY.collect())
    missing = sorted(n for n in used if n != "up" and n not in trainer | operator)
    assert missing == [], f"alerts query metrics nobody serves: {missing}"


# ---------------------------------------------------------------------------------- promtool


@pytest.fixture(scope="module")
def promtool() -> str:
    """Debian's prometheus package ships promtool; node-packages.sh installs it (as root) where it
    is missing, as it does for the cluster tier's Prometheus server."""
    if shutil.which("promtool") is None:
        subprocess.run(["bash", str(NODE_PACKAGES)], capture_output=True, text=True, timeout=900)
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("no promtool: run tests/envtest/node-packages.sh as root (Debian's prometheus package)",
                    pytrace=False)
    return binary


def test_promtool_checks_the_rules(promtool, tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule_groups()}))
    checked = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in checked.stdout


def test_promtool_unit_tests(promtool, tmp_path):
    """alert_rules_test.yaml: a hang against a pause, restart budgets, failed trainings in two
    namespaces (an alert each, with namespace and name), stalls, one failure class repeating across
    an operator restart against failures spread out or not the trainings' own, nodes excluded for the
    first time and again against one excluded long ago, the operator down."""
    # The cases check which alerts fire with which labels; the annotations' wording is left out.
    groups = rule_groups()
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    tested = subprocess.run([promtool, "test", "rules", RULE_TESTS.name], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_failed_alert_is_per_training_with_routing_labels():
    """The promtool case of RosettaTrainingFailed is there, and checks namespace and name."""
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    expected = [alert["exp_labels"] for case in cases for test in case["alert_rule_test"]
                if test["alertname"] == "RosettaTrainingFailed" for alert in test["exp_alerts"]]
    assert {(labels["namespace"], labels["name"]) for labels in expected} == {("ml", "first"), ("nlp", "second")}
    assert all(labels["name"] == labels["training"] for labels in expected)
