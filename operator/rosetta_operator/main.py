"""`rosetta operator`: run the kopf operator in this process.

Equivalent to `kopf run -m rosetta_operator.handlers --standalone --liveness=http://0.0.0.0:8080/healthz -A`
plus the CLI's own flags (passed to the startup hook through kopf's memo). With `--peering NAME`
it joins that KopfPeering instead of running standalone, so two replicas never both act. The
`--policy` file is read here, before kopf starts, so a bad one stops the command with one line.
`--log-level` and `--log-format` set up kopf's own log handler: its text lines, or one JSON object
per line for a cluster's log pipeline.
"""

from __future__ import annotations

import argparse
import logging

LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
LOG_FORMATS = ("text", "json")
# What a log pipeline filters on; kopf adds `object` (kind, namespace, name, uid) to the records of
# one training, pod or JobSet, and its own `severity` (debug, info, warn, error).
JSON_FIELDS = "%(levelname)s %(name)s %(message)s"
JSON_NAMES = {"levelname": "level", "name": "logger"}


def configure_logging(level: str = "info", log_format: str = "text") -> None:
    """kopf's stderr handler on the root logger, at `level`, in kopf's text or JSON format."""
    import kopf

    # kopf exports no JSON formatter; this is the one kopf.configure installs for LogFormat.JSON.
    from kopf._core.actions.loggers import ObjectJsonFormatter

    json_lines = log_format == "json"
    # log_prefix None: `[namespace/name]` before a text line about one object (as `kopf run` writes
    # it; kopf.configure's own default leaves it out), a field of its own in JSON.
    kopf.configure(debug=level == "debug", log_format=kopf.LogFormat.JSON if json_lines else kopf.LogFormat.FULL,
                   log_prefix=None)
    root = logging.getLogger()
    root.setLevel(LOG_LEVELS[level])  # kopf.configure knows debug, info and warning only
    if json_lines:
        # kopf's JSON lines carry only message, timestamp and severity.
        kopf_handler = root.handlers[-1]  # kopf.configure appends its own
        kopf_handler.setFormatter(ObjectJsonFormatter(JSON_FIELDS, rename_fields=JSON_NAMES, timestamp="time"))


def run(args: argparse.Namespace) -> int:
    from rosetta_operator.policy import load_policy

    policy = load_policy(args.policy) if getattr(args, "policy", None) else None

    import kopf

    import rosetta_operator.handlers  # noqa: F401  (registers the handlers)

    namespaces = list(args.namespaces or [])
    clusterwide = bool(args.all_namespaces) or not namespaces
    configure_logging(getattr(args, "log_level", None) or "info", getattr(args, "log_format", None) or "text")
    memo = kopf.Memo(allow_host_path=bool(args.allow_host_path), metrics_port=int(args.metrics_port or 0),
                     progress_interval=float(getattr(args, "progress_interval", 0) or 0), policy=policy,
                     quota_retry=float(getattr(args, "quota_retry", 0) or 0),
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
