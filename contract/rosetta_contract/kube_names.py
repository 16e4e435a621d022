"""Names and values as the apiserver (and a registry) admits them: DNS-1123 labels and subdomains,
environment variable names, mount paths, extended resource names, image references, int32 bounds.

pod_fields.py, volume_fields.py and scheduling_fields.py check the pod-level fields against these.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

from rosetta_contract.strict_model import matches

DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
MOUNT_PATH = r"^/.*[^/]$"
# An extended resource (a GPU) is always domain/name: nvidia.com/gpu, amd.com/gpu.
EXTENDED_RESOURCE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
# An int32 field's largest value; also the largest UID/GID the apiserver admits.
MAX_INT32 = 2**31 - 1
HOSTNAME_LABEL = "kubernetes.io/hostname"


DnsLabel = Annotated[
    str,
    Field(min_length=1, max_length=63, json_schema_extra={"pattern": DNS1123_LABEL}),
    matches(DNS1123_LABEL, "a DNS-1123 label (lowercase letters, digits and '-', alphanumeric at both ends)"),
]
# Secrets, ConfigMaps and PVCs may have dotted names (volumes and containers may not).
ObjectName = Annotated[
    str,
    Field(min_length=1, max_length=253, json_schema_extra={"pattern": DNS1123_SUBDOMAIN}),
    matches(DNS1123_SUBDOMAIN, "a valid object name (lowercase letters, digits, '-' and '.')"),
]


# The distribution reference grammar (github.com/distribution/reference, what registries and the
# kubelet parse): [host[:port]/]path[:tag][@digest], path components in lowercase.
_IMAGE_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = (rf"^(?:{_IMAGE_HOST}/)?{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*"
                   r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$")


def _image_reference(value: str) -> str:
    if not re.match(IMAGE_REFERENCE, value):
        raise ValueError(f"'{value}' is not an image reference a registry accepts "
                         "([registry/]repository[:tag][@sha256:digest], repository in lowercase)")
    name = value.split("@")[0]
    head, _, tail = name.rpartition(":")
    repository = head if head and "/" not in tail else name
    first, slash, _ = repository.partition("/")
    # As docker and containerd read it: the first part is a registry only when it looks like a host.
    if slash and not ("." in first or ":" in first or first == "localhost") and not re.fullmatch(_IMAGE_COMPONENT, first):
        raise ValueError(f"'{value}' is not an image reference a registry accepts (repository names are lowercase)")
    if len(repository) > 255:
        raise ValueError("the repository name is longer than 255 characters")
    port = re.match(r"^[^/\[]*(?:\[[^\]]*\])?:([0-9]+)/", value) if slash else None
    if port and not 0 < int(port[1]) <= 65535:
        raise ValueError(f"'{value}': the registry's port {port[1]} is not a TCP port (1-65535)")
    return value


ImageReference = Annotated[
    str, Field(min_length=1, max_length=512, json_schema_extra={"pattern": IMAGE_REFERENCE}),
    AfterValidator(_image_reference),
]
