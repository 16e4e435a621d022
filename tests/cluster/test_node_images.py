"""The real node's image store: a rebuilt image replaces the old one instead of piling up beside it,
and keeps the layers the two builds share.

The trainer image is several GB and changes with every source change; a store that kept each build
(containerd's CRI names every image by its ID too, so untagging alone keeps it) filled the disk, and
one that dropped the old build before the new one came stored and unpacked every GB again.
"""

from __future__ import annotations

import json

import pytest

import node as real_node

pytestmark = pytest.mark.slow

REF = "rosetta-test/replaced:latest"
ALSO = "rosetta-test/replaced:alias"


def build(node_cluster, entrypoint: str) -> None:
    """A tiny image whose ID depends on `entrypoint`: two calls, two different builds under one tag
    whose first layer (as the trainer's torch layer) is the same."""
    real_node._docker_image_from_binary(node_cluster.node.assets.bin("pause"), entrypoint, REF,
                                        node_cluster.node.workdir, layers_before=("/shared/pause",))


def shared_layer_unpacked_at(node_cluster) -> str:
    """When the node's runtime unpacked the image's first layer (its snapshot is named by the layer's
    diff ID, the chain ID of a first layer)."""
    diff_id = real_node._run("docker", "image", "inspect", "--format", "{{index .RootFS.Layers 0}}", REF).stdout.strip()
    info = node_cluster.node._ctr("snapshots", "--snapshotter", "overlayfs", "info", diff_id)
    return json.loads(info.stdout)["Created"]


def digests_of(node_cluster, *refs: str) -> set[str]:
    images = node_cluster.node.images()
    return {images[real_node._qualified(ref)] for ref in refs}


def test_a_rebuilt_image_replaces_the_old_one_in_the_node_store(node_cluster):
    node = node_cluster.node
    try:
        build(node_cluster, "/first")
        assert node.load_image(REF, ALSO)
        first = digests_of(node_cluster, REF, ALSO)
        assert len(first) == 1
        unpacked = shared_layer_unpacked_at(node_cluster)
        # The ID name the node's runtime adds points at the same build: what kept old builds alive.
        assert [ref for ref, digest in node.images().items() if digest in first and ref.startswith("sha256:")]

        assert not node.load_image(REF, ALSO), "an unchanged image is copied again"

        build(node_cluster, "/second")
        assert node.load_image(REF, ALSO)
        second = digests_of(node_cluster, REF, ALSO)
        assert len(second) == 1 and second != first
        assert not first & set(node.images().values()), "the superseded build is still in the store"
        assert shared_layer_unpacked_at(node_cluster) == unpacked, "a layer both builds share was unpacked again"
    finally:
        for name in (REF, ALSO):
            if node.has_image(name):
                node._ctr("images", "rm", real_node._qualified(name))
        node.remove_superseded_images()
        real_node._run("docker", "image", "rm", "--force", REF, check=False)
        for marker in (node.cache / "imported").glob("rosetta-test_replaced*"):
            marker.unlink()
