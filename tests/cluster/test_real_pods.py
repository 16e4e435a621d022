"""Trainings on a real node: the trainer image built from the Dockerfile, started by the kubelet through
containerd and runc, two pods on the CNI bridge finding rank 0 through CoreDNS at the JobSet's name,
checkpoints on a ReadWriteMany volume. Nothing is simulated: the pods train, fail, restart and finish.

Marked slow: a real training per test (minutes on two CPUs).
"""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path

import pytest
import yaml
from workloads import bound_claim, bound_volume, documents, kubectl, running_pods, status

import node as real_node
from support.cluster import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "manifests" / "examples" / "quickstart-cpu.yaml"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def progress(cluster, namespace: str, name: str) -> dict:
    return status(cluster, namespace, name).get("progress") or {}


def pod_log(cluster, namespace: str, pod: str) -> str:
    return kubectl(cluster, "logs", "-n", namespace, pod, "--tail", "40").stdout


def full_log(cluster, namespace: str, pod: str) -> str:
    return kubectl(cluster, "logs", "-n", namespace, pod).stdout


def gang_pods(cluster, namespace: str, name: str) -> list:
    return [p for p in running_pods(cluster, namespace, name)
            if p.metadata.labels.get("jobset.sigs.k8s.io/replicatedjob-name") == "node"]


def test_quickstart_cpu_trains_on_two_real_pods_and_resumes_after_one_is_deleted(
        node_cluster, node_namespace, node_operator, tmp_path):
    """...with a node affinity set, which the stage pod and both gang pods check again in the image."""
    docs = documents(QUICKSTART)
    name = docs["TranslationTraining"]["metadata"]["name"]
    # The example, shortened to what the behaviour needs (a checkpoint before the pod is deleted, the
    # restart's own, the end, a BLEU above 0): its 600 steps on 20,000 pairs took 20 of the suite's
    # minutes on two shared cores, and the convergence of the example is not what this test proves.
    spec = docs["TranslationTraining"]["spec"]
    spec["data"]["train"] = [{**spec["data"]["train"][0], "size": 4000}]
    spec["training"].update(maxSteps=160, warmupSteps=30)
    # A checkpoint early, so that the pod is deleted with most steps still to go: a step takes about
    # 0.2 s here, and the status shows the checkpoint a scrape later. Validation (200 greedy
    # decodes) only at 80 and at the end: every 20 steps it ran eight times for one final BLEU.
    spec["checkpoint"]["interval"] = 20
    spec["evaluation"]["interval"] = 80
    checkpoint_every = spec["checkpoint"]["interval"]
    # The stage job trains the tokenizer and tokenizes the corpus before the gang starts.
    docs["TranslationTraining"]["spec"]["data"]["prepare"] = "BeforeTraining"
    # An affinity the real node meets: every pod checks it again when it reads the spec, in an image
    # without the Kubernetes client.
    docs["TranslationTraining"]["spec"].setdefault("scheduling", {})["affinity"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [real_node.NODE_NAME]}]}]}}}
    storage = tmp_path / "rwx"  # the example's own claim binds to this volume
    bound_volume(node_cluster, node_namespace, docs["PersistentVolumeClaim"]["metadata"]["name"], storage)
    applied = kubectl(node_cluster, "apply", "-n", node_namespace, "-f", "-",
                      stdin=yaml.safe_dump_all(docs.values()))
    assert applied.returncode == 0, applied.stderr

    pods = wait_for(lambda: (p := gang_pods(node_cluster, node_namespace, name)) and len(p) == 2 and p,
                    "both pods Running on the real node", timeout=420)
    # The stage pod had finished: the gang reused its tokenizer and mapped its ids.
    (prepared,) = [d for d in (storage / name / "prepared").iterdir() if (d / "COMPLETE").exists()]
    assert (storage / name / "tokenizer" / "rosetta-trained-from.json").exists()
    rank0 = next(p for p in pods if (p.metadata.annotations or {}).get(COMPLETION_INDEX) == "0")
    started = wait_for(lambda: "CPU threads" in (log := full_log(node_cluster, node_namespace, rank0.metadata.name))
                       and log, "rank 0 mapping the prepared data and building its model", timeout=300)
    assert "the training text was not read" in started
    assert "tokenizer: reusing" in started and f"prepared/{prepared.name}" in started
    # One CPU requested per pod, one process: one thread, not one per core of the node the pods share.
    assert "device cpu, 1 CPU threads" in started, started
    assert "tokenized and wrote" not in started
    subnet = ipaddress.ip_network(real_node.POD_SUBNET)
    addresses = {p.status.pod_ip for p in pods}
    assert len(addresses) == 2 and all(ipaddress.ip_address(a) in subnet for a in addresses), addresses
    assert {p.spec.node_name for p in pods} == {real_node.NODE_NAME}

    # Rank 1 found rank 0 by the JobSet's DNS name, the gradients cross the bridge, and the
    # operator's scraper reads rank 0's live metrics endpoint into the status.
    wait_for(lambda: progress(node_cluster, node_namespace, name).get("step", 0) > 0,
             f"training progress in {name}'s status", timeout=300)
    saved = wait_for(lambda: progress(node_cluster, node_namespace, name).get("lastCheckpointStep", 0)
                     >= checkpoint_every and progress(node_cluster, node_namespace, name)["lastCheckpointStep"],
                     f"a checkpoint at step {checkpoint_every}", timeout=900)

    victim = next(p for p in running_pods(node_cluster, node_namespace, name)
                  if (p.metadata.annotations or {}).get(COMPLETION_INDEX) == "1")
    deleted = kubectl(node_cluster, "delete", "pod", "-n", node_namespace, victim.metadata.name, "--wait=false")
    assert deleted.returncode == 0, deleted.stderr

    done = wait_for(lambda: (s := status(node_cluster, node_namespace, name)).get("phase") in ("Succeeded", "Failed")
                    and s, f"{name} to finish", timeout=1500)
    assert done["phase"] == "Succeeded", (done, pod_log(node_cluster, node_namespace, victim.metadata.name))
    assert done.get("restarts") == 1, done  # the deleted pod's gang restart, within maxRestarts: 1

    summary = json.loads((storage / name / "summary.json").read_text())
    assert summary["restart_attempt"] == 1
    resumed = summary["resumed_from_step"]
    # The restarted gang went on from the checkpoint the deleted pod and its peer wrote when SIGTERM
    # came, not from step 0 nor from the periodic checkpoint before it.
    assert resumed and resumed > saved, (saved, summary)
    assert summary["steps"] == docs["TranslationTraining"]["spec"]["training"]["maxSteps"]

    # The status ends with the run's own final figures (rank 0's termination message), not with
    # whatever the last scrape before the pods exited saw.
    bleu = done["progress"]["bleu"]
    assert done["progress"]["step"] == summary["steps"] and bleu == round(summary["final_bleu"], 4) > 0, done
    listed = kubectl(node_cluster, "get", "tt", "-n", node_namespace, name)
    assert "Succeeded" in listed.stdout and f"{bleu:g}"[:3] in listed.stdout, listed.stdout

    # The first attempt's pods went with the gang restart long ago; the launcher kept each node's log of
    # each attempt on the claim, and `logs --attempt` reads it back through a pod that mounts the claim
    # read-only, then deletes that pod.
    from test_cli_verbs import rosetta

    from rosetta_operator.attempt_logs import READER_LABEL

    kept = sorted(str(p.relative_to(storage / name)) for p in (storage / name / "logs").rglob("*")) \
        if (storage / name / "logs").is_dir() else []
    code, out, err = rosetta(node_cluster, "logs", name, "-n", node_namespace, "--attempt", "0", "--rank", "0")
    assert code == 0, (err, kept)
    assert "the training text was not read" in out and "resuming from" not in out, (out[-3000:], kept)
    assert err.startswith("==> attempt 0, node 0"), err
    code, out, err = rosetta(node_cluster, "logs", name, "-n", node_namespace, "--attempt", "1", "--rank", "0")
    assert code == 0 and "resuming from" in out, (err, out[-3000:])
    code, out, err = rosetta(node_cluster, "logs", name, "-n", node_namespace, "--attempt", "7")
    assert (code, err) == (1, f"error: training {name} has no kept log for attempt 7 (attempts kept: 0, 1)\n"), \
        (code, err, kept)
    wait_for(lambda: not [p for p in node_cluster.pods(node_namespace) if READER_LABEL in (p.metadata.labels or {})],
             "the log reader pods to be deleted", timeout=30)


def one_pod_training(namespace: str, name: str) -> dict:
    """The quickstart on one pod, a few dozen steps: enough for a checkpoint, an evaluation and BLEU."""
    doc = documents(QUICKSTART)["TranslationTraining"]
    doc["metadata"] = {"name": name, "namespace": namespace}
    spec = doc["spec"]
    spec.update(nodes=1, volumes=[])  # one pod: its own emptyDir is all the storage it needs
    spec["data"]["train"] = [{"format": "generated", "size": 2000, "seed": 1}]
    spec["training"].update(maxSteps=30, warmupSteps=10, logInterval=5)
    spec["checkpoint"]["interval"] = 30
    spec["evaluation"].update(interval=10, maxSamples=40)
    return doc


def test_chart_runs_the_operator_image_in_the_cluster_and_prometheus_scrapes_it(
        node_cluster, node_namespace, tmp_path):
    from test_helm_install import CHART, helm

    from support.prometheus import prometheus

    ns = node_namespace
    repository, tag = node_cluster.images.operator.split(":")
    installed = helm(node_cluster, tmp_path, "install", "rosetta", str(CHART), "--namespace", ns,
                     "--set", "crd.install=false", "--set", f"watchNamespaces={{{ns}}}",
                     "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
                     "--set", "image.pullPolicy=Never", "--set", "operator.extraArgs={--progress-interval=2}",
                     "--wait", "--timeout", "180s")
    assert installed.returncode == 0, installed.stderr + kubectl(node_cluster, "describe", "pods", "-n", ns).stdout

    import kubernetes
    apps = kubernetes.client.AppsV1Api(node_cluster.api)
    (deployment,) = apps.list_namespaced_deployment(ns).items
    assert deployment.status.available_replicas == 1  # a real pod of the operator image, Ready
    (operator_pod,) = [p for p in node_cluster.pods(ns) if p.metadata.name.startswith(deployment.metadata.name)]
    assert operator_pod.spec.node_name == real_node.NODE_NAME

    # `helm test`: the chart's test pod, of the operator image, reads the operator's metrics through
    # its Service by DNS name.
    tested = helm(node_cluster, tmp_path, "test", "rosetta", "--namespace", ns, "--timeout", "180s")
    assert tested.returncode == 0, tested.stdout + tested.stderr + kubectl(node_cluster, "describe", "pods", "-n",
                                                                          ns).stdout
    assert "rosetta-test-operator-serving" in tested.stdout and re.search(r"Phase:\s+Succeeded", tested.stdout), \
        tested.stdout

    (service,) = node_cluster.core.list_namespaced_service(ns).items  # the chart's metrics Service
    port = next(p.port for p in service.spec.ports if p.name == "metrics")
    with prometheus({"rosetta-operator": [f"{service.spec.cluster_ip}:{port}"]}, tmp_path / "prometheus") as prom:
        node_cluster.create_training(ns, one_pod_training(ns, "charted"))
        # The operator in its pod reaches the API through the kubernetes Service (kube-proxy), creates
        # the JobSet, and its progress scraper reads the trainer pod's endpoint across the pod network.
        done = wait_for(lambda: (s := status(node_cluster, ns, "charted")).get("phase") in ("Succeeded", "Failed")
                        and s, "the training to finish", timeout=600)
        assert done["phase"] == "Succeeded", done
        assert done["progress"]["bleu"] >= 0 and done["progress"]["step"] == 30

        # Prometheus scrapes the operator's pod through its metrics Service.
        def scraped() -> float | None:
            return prom.value('rosetta_operator_trainings{job="rosetta-operator",phase="Succeeded"}')
        assert wait_for(scraped, "the operator's Succeeded gauge in Prometheus", timeout=90) == 1
        assert prom.value('up{job="rosetta-operator"}') == 1
        assert prom.value('sum(rosetta_operator_progress_scrapes_total{outcome="updated"})') >= 1

    logs = kubectl(node_cluster, "logs", "-n", ns, f"deployment/{deployment.metadata.name}").stdout
    # As in test_helm_install: only kopf's cluster-wide namespace listing may be refused.
    denied = [line for line in logs.splitlines() if "Forbidden" in line and "/api/v1/namespaces ->" not in line]
    assert not denied, "\n".join(denied[:5])


def test_every_dashboard_panel_has_data_from_a_trainer_pod(node_cluster, node_namespace, node_operator, tmp_path):
    """The Grafana dashboards' queries against Prometheus scraping rank 0's pod, as the chart's
    PodMonitor has a cluster's Prometheus do: every panel over the trainer's own series returns a
    finite value for this training (tests/support/dashboards.py says which need dcgm-exporter or
    node-exporter, and which only a GPU training has)."""
    from support.dashboards import check_variables, split_queries, substitute, wait_for_data
    from support.prometheus import prometheus

    ns, name = node_namespace, "dashboards"
    doc = one_pod_training(ns, name)
    spec = doc["spec"]
    spec["training"].update(maxSteps=100000)  # stopped once every panel has data
    spec["checkpoint"]["interval"] = 20
    spec["evaluation"].update(interval=20, maxSamples=8)
    spec["metrics"] = {**spec.get("metrics", {}), "peakFlops": 1e11}  # a made-up CPU peak: MFU is a figure
    port = spec["metrics"]["port"]
    node_cluster.create_training(ns, doc)

    def trainer_pod():
        return next((p for p in node_cluster.pods(ns) if p.status.phase == "Running" and p.status.pod_ip), None)

    pod = wait_for(trainer_pod, "the trainer pod to run", timeout=300)
    from_trainer, external, absent = split_queries()
    # The host reaches pod IPs over the node's bridge, as a Prometheus pod would over the pod network.
    with prometheus({"trainer": [f"{pod.status.pod_ip}:{port}"]}, tmp_path / "prometheus", interval="1s") as prom:
        missing = wait_for_data(prom, from_trainer, ns, name, lambda: trainer_pod() is not None, timeout=420)
        assert not missing, f"no data for {missing}\n" + pod_log(node_cluster, ns, pod.metadata.name)[-3000:]
        for _, _, expr in external | absent:
            prom.query(substitute(expr, ns, name))  # valid PromQL; no data without the exporter or a GPU
        check_variables(prom, ns, name)
    kubectl(node_cluster, "delete", "tt", "-n", ns, name, "--wait=false")  # the gang stops with it


def test_summarization_with_zero3_and_offload_trains_on_two_real_pods(node_cluster, node_namespace, node_operator,
                                                                     tmp_path):
    """The ZeRO-3 + CPU-offload summarization scenario, CPU-sized: the engine settings of
    t5-summarization-zero3-2x4.yaml on the model and data of examples/summarization.yaml. Every rank
    writes its shard of each checkpoint onto the shared volume.

    DeepSpeed's CPU Adam comes from a cache volume kept between runs (ops_cache.py): the pods compile
    it with the image's compiler (three minutes on one CPU) the first time on a machine, or when the
    compiler, torch or DeepSpeed change, one pod while the other waits; later runs only load it."""
    ns = node_namespace
    doc = documents(REPO / "examples" / "summarization.yaml")["TranslationTraining"]
    scenario = documents(REPO / "manifests" / "examples" / "t5-summarization-zero3-2x4.yaml")["TranslationTraining"]
    spec = doc["spec"]
    spec["distributed"] = scenario["spec"]["distributed"]
    assert spec["distributed"]["zeroStage"] == 3 and spec["distributed"]["offload"]["optimizer"] == "cpu"
    # Room for DeepSpeed compiling its ops beside the trainer (cc1plus takes 1-2 GB per job).
    spec["resources"] = {"cpu": 1, "memory": "6Gi", "shmSize": "1Gi"}
    spec["data"]["train"] = [{"format": "generated", "size": 2000, "seed": 1}]
    spec["training"].update(maxSteps=40, warmupSteps=10, logInterval=5, device="cpu")
    spec["checkpoint"]["interval"] = 20
    spec["evaluation"].update(interval=20, maxSamples=30)
    spec["metrics"] = {"port": 9400}
    name = doc["metadata"]["name"]
    claim = spec["volumes"][0]["persistentVolumeClaim"]["claimName"]
    storage = tmp_path / "rwx"
    bound_claim(node_cluster, ns, claim, folder=storage)
    cache = real_node.node_cache() / "trainer-cache"
    bound_claim(node_cluster, ns, "trainer-cache", folder=cache)
    spec["volumes"].append({"name": "cache", "mountPath": "/cache", "purpose": "cache",
                            "persistentVolumeClaim": {"claimName": "trainer-cache"}})
    applied = kubectl(node_cluster, "apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(doc))
    assert applied.returncode == 0, applied.stderr

    done = wait_for(lambda: (s := status(node_cluster, ns, name)).get("phase") in ("Succeeded", "Failed") and s,
                    f"{name} to finish", timeout=1500)
    pods = node_cluster.pods(ns, name)
    assert done["phase"] == "Succeeded", (done, [pod_log(node_cluster, ns, p.metadata.name) for p in pods])
    summary = json.loads((storage / name / "summary.json").read_text())
    assert summary["steps"] == 40
    config = json.loads((storage / name / "deepspeed_config.json").read_text())
    assert config["zero_optimization"]["stage"] == 3
    assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    # Both ranks wrote their ZeRO-3 partitions into the last checkpoint on the shared volume.
    final = sorted((storage / name / "checkpoints").glob("step-*"))[-1]
    shards = {p.name for p in final.rglob("*optim_states.pt")}
    assert len(shards) == 2, (final, shards)
    assert "rougeL" in json.dumps(summary)
    built = [so.relative_to(cache) for so in (cache / "deepspeed-ops").glob("*/cpu_adam/cpu_adam.so")]
    assert built, sorted(p.relative_to(cache) for p in cache.rglob("*"))
    # This run's pods took CPU Adam from the cache (built or loaded): the .so above may be an earlier
    # run's. Rank 0 logs at INFO; its node's log of each attempt is kept on the volume by the launcher.
    logs = sorted((storage / name / "logs").glob("attempt-*/node-0.log"))
    assert logs and all("DeepSpeed CPU Adam from the ops cache /cache/deepspeed-ops/" in log.read_text()
                        for log in logs), {str(log): log.read_text()[-2000:] for log in logs}
