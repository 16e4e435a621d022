#!/usr/bin/env python3
"""Base images by digest: the Dockerfile's base-image build arguments (the ARGs its FROM lines name),
resolved from their tags through the registry's OCI distribution API.

    scripts/pin_base_images.py --check      # exit 1, naming every base ARG whose default has no digest
    scripts/pin_base_images.py --write      # resolve each default's tag, write NAME=name:tag@sha256:...
    scripts/pin_base_images.py --resolve python:3.11-slim-bookworm   # print the reference with its digest

--write refreshes too: the tag of a default that already has a digest is resolved again and the new
digest replaces the old one, so running it after the base's maintainers rebuilt the tag (security
fixes) and committing the diff is how the bases are updated. The digest is the one the tag names in
the registry: for a multi-platform image its index (manifest list), so every platform stays buildable.

--build-plan is for build_and_push.sh: for the --build-arg pairs it was given and the targets it
builds, one line per base that it pins (`build-arg NAME=REFERENCE@DIGEST`) and per label
(`label TARGET org.opencontainers.image.base.name=...`, `... .base.digest=...`); notes on stderr.

Only the standard library: it runs on whatever machine builds the images. Registries: Docker Hub
(anonymous token), any registry that answers 401 with a Bearer challenge and grants anonymous pulls
(ghcr.io, quay.io, public Artifact Registry and ECR Public repositories), and plain HTTP for
127.0.0.1, localhost and [::1] registries, as Docker itself uses for them.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

DOCKERFILE = Path(__file__).resolve().parents[1] / "Dockerfile"
PROG = "pin_base_images.py"

# The index types first: a multi-platform tag resolves to its index, not to the one platform's
# manifest a registry would pick. A single-platform image has only a manifest, so those are accepted too.
ACCEPT = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_PINNED = re.compile(r"@[a-z0-9]+(?:[+._-][a-z0-9]+)*:[0-9a-fA-F]{32,}$")
_ARG = re.compile(r"^(?P<lead>\s*ARG\s+)(?P<name>[A-Za-z_]\w*)(?:(?P<eq>=)(?P<quote>[\"']?)(?P<value>[^\s\"']*)(?P=quote))?"
                  r"(?P<rest>\s*(?:#.*)?)$", re.I)
_FROM = re.compile(r"^\s*FROM\s+(?:--platform=\S+\s+)?(?P<image>\S+)(?:\s+AS\s+(?P<stage>\S+))?\s*$", re.I)
_VARIABLE = re.compile(r"\$\{?(\w+)")


class PinError(Exception):
    pass


# ---------------------------------------------------------------------------------- the Dockerfile


def _lines(text: str) -> List[str]:
    return text.splitlines(keepends=True)


def _first_from(lines: List[str]) -> int:
    for i, line in enumerate(lines):
        if _FROM.match(line):
            return i
    return len(lines)


def global_args(text: str) -> Dict[str, Optional[str]]:
    """The ARGs before the first FROM (the only ones a FROM can use): {name: default or None}."""
    lines = _lines(text)
    found: Dict[str, Optional[str]] = {}
    for line in lines[:_first_from(lines)]:
        m = _ARG.match(line.rstrip("\r\n"))
        if m:
            found[m.group("name")] = m.group("value") if m.group("eq") else None
    return found


def stages(text: str) -> List[Tuple[str, Optional[str]]]:
    """[(the image a FROM names, as written, its stage name or None)], in order."""
    return [(m.group("image"), m.group("stage")) for m in map(_FROM.match, _lines(text)) if m]


def base_args(text: str) -> Dict[str, Optional[str]]:
    """The global ARGs that FROM lines name, {name: default or None}, in the Dockerfile's order."""
    named = {v for image, _ in stages(text) for v in _VARIABLE.findall(image)}
    return {name: value for name, value in global_args(text).items() if name in named}


def stage_base_arg(text: str, target: str) -> Optional[str]:
    """The base ARG a stage is built on, following stages built on earlier stages; None when its FROM
    names a literal image or more than a bare ${ARG}."""
    images = {stage: image for image, stage in stages(text) if stage}
    seen = set()
    while target in images and target not in seen:
        seen.add(target)
        image = images[target]
        m = re.fullmatch(r"\$\{?(\w+)\}?", image)
        if m:
            return m.group(1)
        target = image
    return None


def set_default(text: str, name: str, value: str) -> str:
    """text with the global ARG `name`'s default set to value; quotes and a trailing comment are kept."""
    lines = _lines(text)
    for i in range(_first_from(lines)):
        body = lines[i].rstrip("\r\n")
        m = _ARG.match(body)
        if m and m.group("name") == name:
            quote = m.group("quote") or ""
            lines[i] = f"{m.group('lead')}{name}={quote}{value}{quote}{m.group('rest')}{lines[i][len(body):]}"
            return "".join(lines)
    raise PinError(f"no ARG {name} before the first FROM")


def is_pinned(reference: str) -> bool:
    return bool(_PINNED.search(reference))


def without_digest(reference: str) -> str:
    return reference.split("@", 1)[0]


def with_digest(reference: str, digest: str) -> str:
    """name[:tag]@digest; a digest the reference had is replaced."""
    if not DIGEST.match(digest):
        raise PinError(f"{digest!r} is not a sha256 digest")
    return f"{without_digest(reference)}@{digest}"


def unpinned(text: str) -> Dict[str, Optional[str]]:
    """The base ARGs whose default is no reference by digest (None: no default at all)."""
    return {name: value for name, value in base_args(text).items() if not (value and is_pinned(value))}


# ----------------------------------------------------------------------------- image references


@dataclass(frozen=True)
class Reference:
    domain: str      # docker.io, ghcr.io, 127.0.0.1:5000
    repository: str  # library/python
    tag: Optional[str]
    digest: Optional[str]

    @property
    def name(self) -> str:
        """Fully qualified, as Docker names it (docker.io/library/python:3.11-slim-bookworm)."""
        return f"{self.domain}/{self.repository}" + (f":{self.tag}" if self.tag else "")

    @property
    def api(self) -> str:
        host = "registry-1.docker.io" if self.domain == "docker.io" else self.domain
        return f"{'http' if _is_local(host) else 'https'}://{host}/v2/{self.repository}"


def _is_local(host: str) -> bool:
    """Docker talks plain HTTP to loopback registries without being told to; so does this."""
    hostname = urllib.parse.urlsplit("//" + host).hostname or ""
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


def parse(reference: str) -> Reference:
    """Docker's reading of a reference: no registry host means Docker Hub, a one-part Hub name is
    under library/, and no tag (nor digest) means latest."""
    if not reference or "$" in reference or any(c.isspace() for c in reference):
        raise PinError(f"{reference!r} is not an image reference")
    rest, _, digest = reference.partition("@")
    if digest and not re.fullmatch(r"[a-z0-9]+(?:[+._-][a-z0-9]+)*:[0-9a-fA-F]{32,}", digest):
        raise PinError(f"{reference!r} has {digest!r}, which is not a digest")
    colon = rest.rfind(":")
    path, tag = (rest[:colon], rest[colon + 1:]) if colon > rest.rfind("/") else (rest, None)
    first, _, remainder = path.partition("/")
    if remainder and ("." in first or ":" in first or first == "localhost" or first.startswith("[")):
        domain, repository = first, remainder
    else:
        domain, repository = "docker.io", path
    if domain in ("index.docker.io", "registry-1.docker.io"):
        domain = "docker.io"
    if domain == "docker.io" and "/" not in repository:
        repository = f"library/{repository}"
    if not re.fullmatch(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*", repository):
        raise PinError(f"{reference!r}: {repository!r} is not a repository name")
    if tag is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag):
        raise PinError(f"{reference!r}: {tag!r} is not a tag")
    return Reference(domain, repository, tag or (None if digest else "latest"), digest or None)


# ------------------------------------------------------------------------------- the registry


def _bearer_token(challenge: str, timeout: float) -> str:
    """An anonymous token for a `WWW-Authenticate: Bearer realm=...,service=...,scope=...` challenge
    (Docker Hub's flow, which most public registries share)."""
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = params.pop("realm", "")
    if not challenge.lower().startswith("bearer") or not realm.startswith(("https://", "http://")):
        raise PinError(f"the registry asks for credentials ({challenge!r}); only anonymous pulls are supported")
    url = realm + ("&" if "?" in realm else "?") + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body = json.load(response)
    token = body.get("token") or body.get("access_token")
    if not token:
        raise PinError(f"{realm} granted no token")
    return str(token)


def _open(url: str, method: str, timeout: float, token: List[str]):
    """urlopen with the manifest types accepted; on a first 401, an anonymous token is fetched and
    kept in `token` for the requests after."""
    while True:
        headers = {"Accept": ACCEPT, "User-Agent": PROG}
        if token:
            headers["Authorization"] = f"Bearer {token[0]}"
        try:
            return urllib.request.urlopen(urllib.request.Request(url, method=method, headers=headers), timeout=timeout)
        except urllib.error.HTTPError as e:
            if e.code != 401 or token:
                raise
            token.append(_bearer_token(e.headers.get("WWW-Authenticate", ""), timeout))


def resolve(reference: str, timeout: float = 20) -> str:
    """The digest the registry serves for the reference's tag now (any digest it had is ignored)."""
    ref = parse(without_digest(reference))
    url = f"{ref.api}/manifests/{ref.tag}"
    token: List[str] = []
    try:
        # HEAD first: Docker Hub does not count it against the anonymous pull limit.
        with _open(url, "HEAD", timeout, token) as response:
            digest = response.headers.get("Docker-Content-Digest", "")
        if DIGEST.match(digest):
            return digest
        # The header is optional: the manifest's own bytes are hashed instead.
        with _open(url, "GET", timeout, token) as response:
            digest = response.headers.get("Docker-Content-Digest", "")
            computed = "sha256:" + hashlib.sha256(response.read()).hexdigest()
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise PinError(f"{ref.name}: no such tag (404 from {url})") from None
        raise PinError(f"{ref.name}: HTTP {e.code} from {url}") from None
    except (urllib.error.URLError, OSError) as e:
        raise PinError(f"{ref.name}: {url} is not reachable ({getattr(e, 'reason', e)})") from None
    if digest and digest != computed:
        raise PinError(f"{url}: the registry says {digest}, its manifest hashes to {computed}")
    return computed


# ------------------------------------------------------------------------------- the commands


def check(text: str) -> List[str]:
    """One line per base ARG not pinned by digest; empty when every one is."""
    return [f"{name}={value}: not pinned by digest" if value else f"{name}: no default"
            for name, value in unpinned(text).items()]


def write(text: str, timeout: float) -> Tuple[str, List[str]]:
    """The Dockerfile with every base ARG's default at its tag's current digest, and what changed.
    Nothing is written unless every base resolves (PinError otherwise)."""
    changes = []
    resolved: Dict[str, str] = {}
    for name, value in base_args(text).items():
        if not value:
            raise PinError(f"ARG {name} has no default to pin")
        if parse(value).tag is None:
            changes.append(f"{name}={value}: kept (a digest without a tag: nothing to resolve again)")
            continue
        tag = without_digest(value)
        if tag not in resolved:
            resolved[tag] = resolve(tag, timeout)
        pinned = with_digest(value, resolved[tag])
        changes.append(f"{name}={pinned}" + (" (unchanged)" if pinned == value else f" (was {value})"))
        text = set_default(text, name, pinned)
    return text, changes


def build_plan(text: str, targets: List[str], build_args: List[str], offline: bool, require: bool,
               timeout: float) -> Tuple[List[str], List[str]]:
    """(stdout lines, notes) for build_and_push.sh: the bases it should build from by digest and the
    labels of each target. A base already pinned is used as it is (only --write moves a pin)."""
    overrides = dict(pair.split("=", 1) for pair in build_args if "=" in pair)
    defaults = base_args(text)
    lines: List[str] = []
    notes: List[str] = []
    effective: Dict[str, str] = {}
    resolved: Dict[str, str] = {}
    for name, default in defaults.items():
        value = overrides.get(name, default)
        if not value:
            raise PinError(f"ARG {name} has no default in the Dockerfile and no BUILD_ARGS value")
        effective[name] = value
        if is_pinned(value):
            continue
        dropped = (f"; BUILD_ARGS' {name} replaces the Dockerfile's pinned {default}"
                   if name in overrides and default and is_pinned(default) else "")
        if offline:
            if require:
                raise PinError(f"{name}={value} is not pinned by digest and nothing is looked up here{dropped}")
            notes.append(f"{name}={value} is a tag, not looked up (--dry-run, PIN_BASES=off): PIN_BASES=auto builds "
                         f"from the digest it names then, off from the tag with no base digest label{dropped}")
            continue
        try:
            if value not in resolved:
                resolved[value] = resolve(value, timeout)
        except PinError as e:
            if require:
                raise PinError(f"{name}={value} cannot be pinned: {e}{dropped}") from None
            notes.append(f"WARNING: {name}={value} cannot be pinned ({e}): built from the tag, whatever it "
                         f"names today, with no base digest label (PIN_BASES=require refuses){dropped}")
            continue
        effective[name] = with_digest(value, resolved[value])
        lines.append(f"build-arg {name}={effective[name]}")
        notes.append(f"{name}={value} is {resolved[value]} today: built from {effective[name]}")
    for target in targets:
        name = stage_base_arg(text, target)
        if name is None:
            raise PinError(f"stage {target!r}: no FROM ${{ARG}} to take its base from")
        value = effective[name]
        if is_pinned(value):
            ref = parse(value)
            lines.append(f"label {target} org.opencontainers.image.base.name={ref.name}")
            lines.append(f"label {target} org.opencontainers.image.base.digest={ref.digest}")
    return lines, notes


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 naming every base ARG without a digest")
    mode.add_argument("--write", action="store_true", help="pin (or re-pin) every base ARG to its tag's digest")
    mode.add_argument("--resolve", metavar="REFERENCE", help="print REFERENCE with its tag's current digest")
    mode.add_argument("--build-plan", action="store_true", help="what build_and_push.sh builds from and labels")
    parser.add_argument("--dockerfile", type=Path, default=DOCKERFILE, help="default: the repository's Dockerfile")
    parser.add_argument("--target", action="append", default=[], help="--build-plan: an image target (repeated)")
    parser.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE",
                        help="--build-plan: a build argument the build is given (repeated)")
    parser.add_argument("--offline", action="store_true", help="--build-plan: look nothing up")
    parser.add_argument("--require", action="store_true", help="--build-plan: fail unless every base is pinned")
    parser.add_argument("--timeout", type=float, default=20, help="seconds per registry request (default 20)")
    args = parser.parse_args(argv)
    try:
        if args.resolve:
            print(with_digest(args.resolve, resolve(args.resolve, args.timeout)))
            return 0
        text = args.dockerfile.read_text()
        if not base_args(text):
            raise PinError(f"{args.dockerfile}: no FROM names a build argument")
        if args.check:
            problems = check(text)
            for line in problems:
                print(f"{args.dockerfile.name}: {line}")
            if problems:
                print(f"{PROG}: {len(problems)} base image(s) not pinned; `scripts/{PROG} --write` pins them (it needs the registry)", file=sys.stderr)
                return 1
            print(f"{args.dockerfile.name}: every base image is pinned by digest")
            return 0
        if args.write:
            new, changes = write(text, args.timeout)
            for line in changes:
                print(f"{args.dockerfile.name}: {line}")
            if new != text:
                args.dockerfile.write_text(new)
            return 0
        lines, notes = build_plan(text, args.target, args.build_arg, args.offline, args.require, args.timeout)
        for note in notes:
            print(f"{PROG}: {note}", file=sys.stderr)
        for line in lines:
            print(line)
        return 0
    except PinError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
