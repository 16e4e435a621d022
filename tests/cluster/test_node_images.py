"""The real node's image store: a rebuilt image replaces the old one instead of piling up beside it.

The trainer image is several GB and changes with every source change; a store that kept each build
(containerd's CRI names every image by its ID too, so untagging alone keeps it) filled the disk.
"""

from __future__ import annotations

import pytest

import node as real_node

pytestmark = pytest.mark.slow

REF = "rosetta-test/replaced:latest"
ALSO = "rosetta-test/replaced:alias"


def build(node_cluster, entrypoint: str) -> None:
    """A tiny image whose ID depends on `entrypoint`: two calls, two different builds under one tag."""
    real_node._docker_image_from_binary(node_cluster.node.assets.bin("pause"), entrypoint, REF,
                                        node_cluster.node.workdir)


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
        # The ID name the node's runtime adds points at the same build: what kept old builds alive.
        assert [ref for ref, digest in node.images().items() if digest in first and ref.startswith("sha256:")]

        assert not node.load_image(REF, ALSO), "an unchanged image is copied again"

        build(node_cluster, "/second")
        assert node.load_image(REF, ALSO)
        second = digests_of(node_cluster, REF, ALSO)
        assert len(second) == 1 and second != first
        assert not first & set(node.images().values()), "the superseded build is still in the store"
    finally:
        for name in (REF, ALSO):
            if node.has_image(name):
                node._ctr("images", "rm", real_node._qualified(name))
        node.remove_superseded_images()
        real_node._run("docker", "image", "rm", "--force", REF, check=False)
        for marker in (node.cache / "imported").glob("rosetta-test_replaced*"):
            marker.unlink()
