"""The model registry (:mod:`fedlmc.models.registry`): entries, options and parameter counts."""

from __future__ import annotations

import sys

import pytest

from fedlmc.models.registry import (
    MODEL_ALLOW_VARIABLE,
    factory_allowed,
    is_factory_path,
    model_entry,
    model_names,
    parameter_count,
    public_options,
    register_model,
    user_factory,
)


def test_the_built_in_models_are_registered_in_order():
    names = model_names()
    assert names[0] == "mlp" and {"mlp", "vgg11", "resnet20", "vit"} <= set(names)
    assert model_entry("mlp").default_norm == "none"


def test_an_unknown_model_is_named_with_the_registered_ones():
    with pytest.raises(ValueError, match="mlpp"):
        model_entry("mlpp")


def test_a_factory_path_is_a_model_of_its_own():
    assert is_factory_path("pkg.nets:make") and not is_factory_path("mlp")
    entry = model_entry("pkg.nets:make")
    assert entry.default_norm == "none" and entry.options == {}
    assert factory_allowed("pkg.nets:make", "pkg.nets:*")
    assert not factory_allowed("pkg.nets:make", "other:*")


def test_a_factory_module_in_the_current_folder_is_found_as_python_m_finds_it(
    tmp_path, monkeypatch
):
    """The folder fedlmc was started in is searched first, as ``python -m`` does, though it is
    not on ``sys.path`` (the ``fedlmc`` console script's); a module elsewhere: PYTHONPATH."""
    name = f"my_nets_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(
        "def make_net(width, num_classes, in_shape, norm='none'):\n    return None\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in {"", ".", str(tmp_path)}])
    monkeypatch.delenv(MODEL_ALLOW_VARIABLE, raising=False)
    assert user_factory(f"{name}:make_net").__name__ == "make_net"
    with pytest.raises(ValueError, match=r"No module named 'no_nets'.*PYTHONPATH"):
        user_factory("no_nets:make_net")


@pytest.mark.parametrize("name", ["mlp", "vgg11", "resnet20"])
def test_declared_parameter_counts_equal_the_built_models(name):
    in_shape = (1, 28, 28) if name == "mlp" else (3, 32, 32)
    declared = parameter_count(name, 0.5, 10, in_shape)
    built = parameter_count(name, 0.5, 10, in_shape, build=True)
    assert declared is None or declared == built
    assert built > 0


def test_public_options_name_the_models_that_have_them():
    options = public_options()
    assert "mlp" in options["depth"][1]


def test_bad_norms_are_refused_with_what_is_allowed():
    with pytest.raises(ValueError, match="norms = .*allowed"):
        register_model("bad_norms_model", "pkg.nets:make", norms=("group",))
    with pytest.raises(ValueError, match="default_norm = 'bn'; allowed: none"):
        register_model("bad_default_model", "pkg.nets:make", norms=("none",), default_norm="bn")
