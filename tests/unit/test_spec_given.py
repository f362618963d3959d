"""``Client.create_table`` takes a whole ``TableSpec`` as well as a name and fields
(``tables/spec.spec_given``): a spec passed where the name goes used to be refused as a bad
table name, with the spec's repr as the "name"."""

from __future__ import annotations

import dataclasses

import pytest

from paramserver.errors import ConfigError
from paramserver.tables.spec import TableSpec, spec_given

DEFAULTS = {"optimizer": "sgd", "initializer": "zeros", "seed": 0, "consistency": "asp", "aggregate": False,
            "replicas": 1, "key_bits": 0, "block_size": 0, "filters": None, "lifecycle": None, "storage": "float32"}


def test_a_spec_given_alone_is_the_spec_created():
    spec = TableSpec("m/w", 8, optimizer={"name": "ftrl", "alpha": 0.1}, consistency="ssp:2", replicas=2)
    assert spec_given(spec, 1, dict(DEFAULTS)) is spec


def test_a_name_and_fields_build_the_spec_as_before():
    fields = {**DEFAULTS, "optimizer": {"name": "adagrad", "lr": 0.05}, "replicas": 2}
    assert spec_given("m/w", 4, fields) == TableSpec("m/w", 4, optimizer={"name": "adagrad", "lr": 0.05}, replicas=2)


@pytest.mark.parametrize("dim, changed", [(4, {}), (1, {"replicas": 3}), (1, {"optimizer": "ftrl"}),
                                          (2, {"storage": "fp16"})])
def test_a_spec_with_other_arguments_beside_it_is_refused_naming_them(dim, changed):
    spec = TableSpec("m/w", 8)
    with pytest.raises(ConfigError, match="spec alone") as err:
        spec_given(spec, dim, {**DEFAULTS, **changed})
    named = ({"dim"} if dim != 1 else set()) | set(changed)
    assert all(f"{k}=" in str(err.value) for k in named), str(err.value)
    assert "'m/w'" in str(err.value)


def test_the_way_to_change_a_field_of_a_spec_works():
    spec = dataclasses.replace(TableSpec("m/w", 8), replicas=2)
    assert spec_given(spec, 1, dict(DEFAULTS)).replicas == 2
