"""Corpus documents written at test time: bytes a text file in git would mangle or bloat.

Each starts from corpus/valid/minimal-from-scratch.yaml (the base every bad document varies) and
changes one thing. Their expectations are here, in the same terms as a committed file's headers.
"""

from __future__ import annotations

from hostile.corpus import CORPUS, Case


def base(name: str) -> str:
    text = (CORPUS / "valid" / "minimal-from-scratch.yaml").read_text()
    body = "".join(line + "\n" for line in text.splitlines() if not line.startswith("# "))
    return body.replace("name: ok-minimal-from-scratch", f"name: {name}")


def with_spec(name: str, lines: str) -> str:
    """The base document with YAML `lines` (indented as spec's fields) added to its spec."""
    return base(name) + lines.rstrip("\n") + "\n"


def latin1() -> bytes:
    return base("yaml-not-utf8").replace("name: yaml-not-utf8", "name: caf\xe9").encode("latin-1")


def utf16() -> bytes:
    return base("yaml-utf16").encode("utf-16")  # with a byte order mark


def raw_control(char: str, name: str) -> bytes:
    return base(name).replace("sourceLang: en", f"sourceLang: e{char}n").encode()


def over_one_mib() -> bytes:
    return (base("yaml-over-one-mib") + "# " + "x" * (1 << 20) + "\n").encode()


def depth(levels: int) -> bytes:
    return with_spec(f"yaml-depth-{levels}", f"  scheduling:\n    affinity: {{x: {'[' * levels}{']' * levels}}}").encode()


def long_data_path() -> bytes:
    # 1 MB: under the file limit, so the field is what must be refused.
    return base("data-path-one-mb").replace(
        "- {format: generated, size: 100}", "- {format: tsv, path: /" + "a" * 999_999 + "}").encode()


def env_values(name: str, count: int, size: int) -> bytes:
    """`count` env variables of `size` characters each: under every per-field limit, too much together."""
    variables = "".join(f"  - {{name: V{i}, value: {'x' * size}}}\n" for i in range(count))
    return with_spec(name, "  env:\n" + variables).encode()


def aliased_env() -> bytes:
    """33 KB of YAML that expands to 1.3 MB: one 32,000-character value, aliased by 40 variables."""
    lines = ["  env:", f"  - {{name: V0, value: &big {'x' * 32_000}}}"]
    lines += [f"  - {{name: V{i}, value: *big}}" for i in range(1, 40)]
    return with_spec("size-aliased-env", "\n".join(lines)).encode()


def big_deepspeed() -> bytes:
    keys = "".join(f"      key{i}: {'d' * 1000}\n" for i in range(300))
    return with_spec("size-deepspeed-300k", "  gpusPerNode: 1\n  distributed:\n    backend: deepspeed\n"
                                             "    deepspeedConfig:\n" + keys).encode()


def big_affinity() -> bytes:
    values = ", ".join(f"node-{i:06d}-{'a' * 40}" for i in range(6000))
    return with_spec("size-affinity-300k", "  scheduling:\n    affinity:\n      nodeAffinity:\n"
                     "        requiredDuringSchedulingIgnoredDuringExecution:\n          nodeSelectorTerms:\n"
                     "          - matchExpressions:\n"
                     f"            - {{key: node, operator: In, values: [{values}]}}").encode()


def crlf() -> bytes:
    return base("ok-crlf").replace("\n", "\r\n").encode()


def bom() -> bytes:
    return "\ufeff".encode() + base("ok-utf8-bom").encode()


GENERATED = [
    Case("bad/yaml/not-utf8", "a Latin-1 byte in the name", expect="not UTF-8", cluster_expect="metadata.name",
         make=latin1),
    Case("bad/yaml/utf16", "the whole document in UTF-16 with a byte order mark", expect="not UTF-8", make=utf16,
         cluster_skip="kubectl reads UTF-16 with a byte order mark and sends a valid training"),
    Case("bad/yaml/bell-character", "a raw BEL control character inside a value", expect="control characters",
         make=lambda: raw_control("\x07", "yaml-bell-character")),
    Case("bad/yaml/nul-byte", "a raw NUL byte inside a value", expect="control characters",
         make=lambda: raw_control("\x00", "yaml-nul-byte")),
    Case("bad/yaml/escape-character", "a raw ESC byte inside a value", expect="control characters",
         make=lambda: raw_control("\x1b", "yaml-escape-character")),
    Case("bad/yaml/over-one-mib", "a file over 1 MiB", expect="larger than 1 MiB", make=over_one_mib,
         cluster_skip="the megabyte is a comment, which kubectl drops; it sends a valid training"),
    Case("bad/yaml/depth-5000", "5,000 levels of nested lists", expect="nested more than 100 levels deep",
         make=lambda: depth(5000)),
    Case("bad/data/path-one-mb", "a data path of a million characters", expect="spec.data.train[0].path",
         make=long_data_path),
    Case("bad/size/env-300k", "ten env values of 30,000 characters: the JobSet's copy of the spec passes 256 KiB",
         expect="spec.env", cluster_expect="metadata.annotations",
         make=lambda: env_values("size-env-300k", 10, 30_000)),
    Case("bad/size/aliased-env", "40 env variables aliasing one 32,000-character value: 1.3 MB, over the "
         "ConfigMap's 1 MiB, from 33 KB of YAML", expect="spec.env", cluster_expect="metadata.annotations",
         make=aliased_env),
    Case("bad/size/deepspeed-300k", "a deepspeedConfig of 300 KB", expect="spec.distributed",
         cluster_expect="metadata.annotations", make=big_deepspeed),
    Case("bad/size/affinity-300k", "an affinity listing 6,000 nodes", expect="spec.scheduling",
         cluster_expect="metadata.annotations", make=big_affinity),
    Case("valid/crlf", "Windows line endings", make=crlf),
    Case("valid/utf8-bom", "a UTF-8 byte order mark before the document", make=bom),
]
