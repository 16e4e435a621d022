"""Rosetta from Python: submit the CPU quickstart, follow it, pause it, wait for it, read its results.

Run it as a script (`python examples/sdk_quickstart.py`) or cell by cell (`# %%` marks the cells
for VS Code, PyCharm and Jupytext). It needs what `rosetta submit` needs: a cluster with the
TranslationTraining CRD and the operator (docs/operator.md, Install), a kubeconfig that reaches it,
and `pip install 'rosetta-mt[operator]'`. The quickstart's checkpoint claim must be able to bind
(docs/operator.md, First cluster run).

Every call below is also a command: the comment beside it says which.
"""

# %% Connect: the cluster, context and namespace kubectl would use, unless given here.
import itertools
import sys
from pathlib import Path

from rosetta_operator import Client, RosettaError, TrainingEnded

client = Client()  # Client(kubeconfig="~/.kube/prod", context="eks-ml", namespace="ml")
print(client)

# %% Submit: validated first, as the operator validates it; the file's PersistentVolumeClaim too.
# rosetta submit -f manifests/examples/quickstart-cpu.yaml --set spec.training.maxSteps=200
EXAMPLE = Path(__file__).resolve().parents[1] / "manifests" / "examples" / "quickstart-cpu.yaml"
training = client.submit(EXAMPLE, overrides=["spec.training.maxSteps=200", "metadata.labels.owner=sdk-quickstart"],
                         on_applied=print)
name = training["metadata"]["name"]

# A dict (or a rosetta_contract.spec.TranslationTraining) works as well as a file:
#   client.submit({"apiVersion": "rosetta.dev/v1alpha1", "kind": "TranslationTraining", ...})

# %% Wait for the pods to run: each phase the operator reports is printed as it comes.
# rosetta wait quickstart-cpu --for phase=Running --timeout 10m
client.wait(name, "Running", timeout=600,
            on_change=lambda obj: print("phase:", (obj.get("status") or {}).get("phase")))

# %% Trainings by label, as `rosetta get -l owner=sdk-quickstart -o name` lists them.
print([t["metadata"]["name"] for t in client.list(label_selector="owner=sdk-quickstart")])

# %% The first lines of rank 0's log (rosetta logs quickstart-cpu -f), then of every rank.
for line in itertools.islice(client.logs(name, follow=True), 20):  # leaving the loop stops following
    print(line)
for line in client.logs(name, all_ranks=True, tail=3):  # rosetta logs quickstart-cpu --all-ranks --tail 3
    print(line)  # "[rank 1] step 40 ..."

# %% Pause it and let it go on: the pods stop (saving a checkpoint), then start again from it.
# rosetta suspend quickstart-cpu --wait; rosetta resume quickstart-cpu --wait
client.suspend(name)
client.wait(name, "Suspended", timeout=300)
client.resume(name)

# %% Watch the phase change after the resume (rosetta get quickstart-cpu -w), for a minute at most.
for event in client.watch(name, timeout=60):
    phase = (event.training.get("status") or {}).get("phase")
    print(event.type, phase)
    if phase not in (None, "Suspended"):
        break

# %% Wait for the end; a failure says why (exit status 1 on the command line).
try:
    client.wait(name, "Succeeded", timeout=3600)
except TrainingEnded as exc:
    print(f"{name} ended {exc.phase}: {exc}", file=sys.stderr)
except RosettaError as exc:  # timed out, deleted meanwhile, the cluster unreachable
    print(f"error: {exc}", file=sys.stderr)

# %% What `rosetta status quickstart-cpu` shows, as data.
status = client.status(name)
print(status.phase, status.progress.get("display"), "BLEU", status.progress.get("bleu"))
print("last checkpoint:", status.last_checkpoint, "restarts:", status.restarts)
for event in status.events[-5:]:
    print(event["type"], event["reason"], event["object"], event["message"])

# %% Clean up (rosetta delete quickstart-cpu --wait); the checkpoints stay on their volume.
client.delete(name, wait=True, timeout=300)
