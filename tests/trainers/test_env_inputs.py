"""Tasks users bring: ``module:EnvId`` ids, Dict and image observations (vectors
concatenated, images through a CNN, text dropped), end to end with ``recurrl train``."""

from __future__ import annotations

import sys
import textwrap

import gymnasium
import pytest

from recurrl.trainers.config import EnvConfig

MODULE = "tests.trainers.env_inputs_envs"
DICT_ENV = f"{MODULE}:RecurrlTestEnv-v0"
PIXELS_ENV = f"{MODULE}:RecurrlTestPixels-v0"


# ---------------------------------------------------------------------- env ids
def test_module_id_imports_the_module_and_keeps_the_spelling():
    cfg = EnvConfig(env=DICT_ENV)
    assert cfg.gym_id() == DICT_ENV  # Ray workers and `recurrl eval` import it again
    assert "RecurrlTestEnv-v0" in gymnasium.registry


def test_unknown_module_is_one_line_with_pip_install():
    with pytest.raises(ValueError, match="pip install recurrl_no_such_pkg") as info:
        EnvConfig(env="recurrl_no_such_pkg:Task-v0")
    assert "\n" not in str(info.value)


def test_module_without_the_id():
    with pytest.raises(ValueError, match="registers no env 'NoSuchTask-v0'"):
        EnvConfig(env=f"{MODULE}:NoSuchTask-v0")


def test_malformed_module_id():
    with pytest.raises(ValueError, match="expected 'module:EnvId'"):
        EnvConfig(env="a:b:Task-v0")


def test_id_of_a_package_not_imported_suggests_the_module_spelling(tmp_path, monkeypatch):
    # an installed package whose import registers the id (as minigrid registers MiniGrid-*)
    (tmp_path / "recurrlpkg.py").write_text(
        textwrap.dedent(f"""
        import gymnasium
        gymnasium.register("RecurrlPkg-Memory-v0", entry_point="{MODULE}:CueImageEnv")
        """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "recurrlpkg", raising=False)
    monkeypatch.delitem(gymnasium.registry, "RecurrlPkg-Memory-v0", raising=False)
    try:
        with pytest.raises(ValueError, match="Fix: --env recurrlpkg:RecurrlPkg-Memory-v0"):
            EnvConfig(env="RecurrlPkg-Memory-v0")
    finally:
        gymnasium.registry.pop("RecurrlPkg-Memory-v0", None)


def test_unknown_id_without_a_module_names_the_spelling():
    with pytest.raises(ValueError, match="module:EnvId") as info:
        EnvConfig(env="RecurrlNothing-v0")
    assert "Fix: --env" not in str(info.value)
