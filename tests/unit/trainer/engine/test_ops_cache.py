"""Where the trainer builds DeepSpeed's CPU Adam: the cache folder per machine type, and the user's
TORCH_EXTENSIONS_DIR first. (The build itself, by two processes at once: tests/training/test_ops_cache_build.py.)"""

from rosetta_trainer.engine import ops_cache

X86 = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: fpu vme sse2 avx2 avx512f

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: fpu vme sse2 avx2 avx512f
"""


def test_the_cpu_identity_is_the_first_processors_model_and_flags(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(X86)
    assert ops_cache.cpu_identity(cpuinfo) == "model name=Intel(R) Xeon(R) Platinum 8488C|flags=fpu vme sse2 avx2 avx512f"
    cpuinfo.write_text(X86.replace(" avx512f", "", 1))  # the same model, without AVX-512 on the first core
    assert "avx512f" not in ops_cache.cpu_identity(cpuinfo)


def test_machine_types_that_differ_get_folders_that_differ(monkeypatch):
    monkeypatch.setattr(ops_cache, "cpu_identity", lambda: "model name=A|flags=avx2")
    avx2 = ops_cache.machine_key()
    monkeypatch.setattr(ops_cache, "cpu_identity", lambda: "model name=A|flags=avx2 avx512f")
    avx512 = ops_cache.machine_key()
    assert avx512 != avx2
    monkeypatch.setattr(ops_cache, "compiler_version", lambda: "99.1.0")
    assert ops_cache.machine_key() not in (avx2, avx512)  # another compiler, the same CPU


def test_the_cache_sets_the_extension_folder_and_the_users_own_wins(monkeypatch, tmp_path):
    monkeypatch.delenv(ops_cache.EXTENSIONS_ENV, raising=False)
    monkeypatch.delenv(ops_cache.CACHE_ENV, raising=False)
    assert ops_cache.use_ops_cache() is None  # no cache volume: DeepSpeed's default

    monkeypatch.setenv(ops_cache.CACHE_ENV, str(tmp_path / "ops"))
    folder = ops_cache.use_ops_cache()
    assert folder == tmp_path / "ops" / ops_cache.machine_key() and folder.is_dir()
    assert ops_cache.os.environ[ops_cache.EXTENSIONS_ENV] == str(folder)

    monkeypatch.setenv(ops_cache.EXTENSIONS_ENV, "/mine")
    assert ops_cache.use_ops_cache() is None
    assert ops_cache.os.environ[ops_cache.EXTENSIONS_ENV] == "/mine"


def test_only_an_offloaded_deepspeed_adam_is_built(monkeypatch):
    built = []
    monkeypatch.setattr(ops_cache, "use_ops_cache", lambda: built.append(True))
    offload = {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}
    ops_cache.prepare_cpu_adam({**offload, "optimizer": {"type": "Lion"}})
    ops_cache.prepare_cpu_adam({"zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW"}})
    assert not built
    ops_cache.prepare_cpu_adam({**offload, "optimizer": {"type": "AdamW"}})
    assert built == [True]


def test_a_cache_that_cannot_be_used_leaves_the_build_to_deepspeed(monkeypatch, tmp_path, caplog):
    monkeypatch.delenv(ops_cache.EXTENSIONS_ENV, raising=False)
    not_a_folder = tmp_path / "ops"
    not_a_folder.write_text("")  # as a read-only or lock-less mount refuses, with an OSError
    monkeypatch.setenv(ops_cache.CACHE_ENV, str(not_a_folder))
    ops_cache.prepare_cpu_adam({"zero_optimization": {"offload_optimizer": {"device": "cpu"}},
                                "optimizer": {"type": "AdamW"}})
    assert ops_cache.EXTENSIONS_ENV not in ops_cache.os.environ
    assert f"the ops cache {not_a_folder} cannot be used" in caplog.text


def test_a_build_that_fails_on_the_cache_gives_the_folder_back_to_deepspeed(monkeypatch, tmp_path, caplog):
    """The cache's folder was made and TORCH_EXTENSIONS_DIR pointed at it, then the build could not
    write there: DeepSpeed must not be left loading from a folder it cannot build in."""
    monkeypatch.delenv(ops_cache.EXTENSIONS_ENV, raising=False)
    monkeypatch.setenv(ops_cache.CACHE_ENV, str(tmp_path / "ops"))

    def refused(folder):
        assert ops_cache.os.environ[ops_cache.EXTENSIONS_ENV] == str(folder)
        raise PermissionError(13, "Read-only file system", str(folder / "build.lock"))

    monkeypatch.setattr(ops_cache, "build_cpu_adam", refused)
    ops_cache.prepare_cpu_adam({"zero_optimization": {"offload_optimizer": {"device": "cpu"}},
                                "optimizer": {"type": "AdamW"}})
    assert ops_cache.EXTENSIONS_ENV not in ops_cache.os.environ
    assert "cannot be used" in caplog.text and "Read-only file system" in caplog.text
