"""The arguments the `rosetta` cluster verbs share, as kubectl spells them: durations (`90s`, `10m`,
`1h30m`), `-o` formats, `--kubeconfig`/`--context`/`-n`, and each verb's help with its examples and
exit statuses. Checked while parsing, so that a typo is exit 2 before any cluster is asked.
"""

from __future__ import annotations

import argparse
import re

DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s?)?$")

EXIT_STATUS = """\
exit status:
  0    done
  1    the cluster said no, or the training did not get there: not found, forbidden,
       unreachable, timed out, ended in another phase
  2    invalid input: a bad argument, an invalid TranslationTraining
  130  interrupted (Ctrl-C)"""


def duration_seconds(text: str) -> float:
    """`90`, `90s`, `10m`, `1h30m` as seconds (kubectl's --timeout); ArgumentTypeError otherwise."""
    match = DURATION.match(text.strip())
    if not text.strip() or not match or not any(match.groups()):
        raise argparse.ArgumentTypeError(f"'{text}' is not a duration like 90s, 10m or 1h30m")
    h, m, s = match.groups()
    return int(h or 0) * 3600 + int(m or 0) * 60 + float(s or 0)


def positive_duration(text: str) -> float:
    seconds = duration_seconds(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"'{text}': a duration longer than 0s")
    return seconds


def node_rank(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not a node rank (0, 1, …)")
    return value


def attempt_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not an attempt (0 for the first, 1 after one gang restart, …)")
    return value


OUTPUTS = ("table", "wide", "name", "json", "yaml")


def output_format(text: str) -> str:
    """-o as kubectl takes it: table (the default), wide, name, json, yaml or jsonpath=TEMPLATE
    (the template is checked here, so that a typo is exit 2 before the cluster is asked)."""
    from rosetta_operator.describe import parse_jsonpath

    if text in OUTPUTS:
        return text
    kind, sep, template = text.partition("=")
    if kind == "jsonpath" and sep:
        try:
            parse_jsonpath(template)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"jsonpath: {exc}") from None
        return text
    raise argparse.ArgumentTypeError(f"'{text}': the formats are {', '.join(OUTPUTS)} and jsonpath=TEMPLATE")


def cluster_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: the current one)")
    p.add_argument("-n", "--namespace", help="namespace (default: the context's, else 'default')")


def output_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", type=output_format, default="table", metavar="FORMAT",
                   help="table (default), wide, name, json, yaml, or jsonpath=TEMPLATE as kubectl's, "
                        "e.g. jsonpath='{.status.phase}'")


def verb_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str, description: str,
          examples: str) -> argparse.ArgumentParser:
    """A verb's parser: its help says what it does, then examples (with the program's name as it was
    invoked: `rosetta` or `kubectl rosetta`) and the exit statuses."""
    import textwrap

    # Raw, for the examples' layout; so the description is wrapped here.
    return sub.add_parser(name, help=help, description=textwrap.fill(description, 80),
                          epilog=f"examples:\n{examples}\n\n{EXIT_STATUS}",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
