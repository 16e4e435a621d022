"""`rosetta operator`: run the kopf operator in this process.

Equivalent to `kopf run -m rosetta_operator.handlers --standalone --liveness=http://0.0.0.0:8080/healthz -A`
plus the CLI's own flags (passed to the startup hook through kopf's memo). With `--peering NAME`
it joins that KopfPeering instead of running standalone, so two replicas never both act. The
`--policy` file is read here, before kopf starts, so a bad one stops the command with one line.
"""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from rosetta_operator.policy import load_policy

    policy = load_policy(args.policy) if getattr(args, "policy", None) else None

    import kopf

    import rosetta_operator.handlers  # noqa: F401  (registers the handlers)

    namespaces = list(args.namespaces or [])
    clusterwide = bool(args.all_namespaces) or not namespaces
    kopf.configure(verbose=False)
    memo = kopf.Memo(allow_host_path=bool(args.allow_host_path), metrics_port=int(args.metrics_port or 0),
                     progress_interval=float(getattr(args, "progress_interval", 0) or 0), policy=policy,
                     default_image=getattr(args, "default_image", None) or None)
    kopf.run(
        clusterwide=clusterwide,
        namespaces=[] if clusterwide else namespaces,
        # 0.0.0.0: the kubelet probes the pod IP.
        liveness_endpoint=f"http://0.0.0.0:{args.liveness_port}/healthz" if args.liveness_port else None,
        memo=memo,
        # With a peering name, replicas elect one active operator; without, this one is alone.
        peering_name=getattr(args, "peering", None) or None,
        standalone=not getattr(args, "peering", None),
    )
    return 0
