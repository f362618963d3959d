"""A saved model (``train --save DIR``) read back by ``load_model`` (predict, eval, serve): damaged
or foreign files are a ``DataError`` naming the folder and the fix, never a bare traceback."""

from __future__ import annotations

import json

import numpy as np
import pytest

from paramserver import load_model
from paramserver.apps.ctr.modelfile import save_model
from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.train_config import TrainConfig
from paramserver.data.reader import DataError, DataFormat
from paramserver.tables.spec import TableSpec


def _saved(tmp_path):
    url = str(tmp_path / "m")
    model = Model("lr")
    spec = TableSpec(model.table, model.dim, optimizer=TrainConfig(model=model).table_spec().optimizer,
                     initializer=model.initializer())
    keys = np.arange(1, 11, dtype=np.uint64)
    save_model(url, model, DataFormat("criteo"), spec, keys, np.linspace(-1, 1, 10, dtype=np.float32)[:, None])
    return tmp_path / "m"


def test_a_saved_model_loads(tmp_path):
    assert load_model(str(_saved(tmp_path))).table.items()[0].size == 10


@pytest.mark.parametrize(("damage", "says"), [
    (lambda m: (m / "table.npz").write_bytes((m / "table.npz").read_bytes()[:100]),  # was zipfile.BadZipFile
     r"m: the model files are damaged \(File is not a zip file\); save the model again"),
    (lambda m: (m / "model.json").write_text('{"a": 1}'),  # was KeyError: 'model'
     r"m: its model.json is not one train --save writes \(KeyError: 'model'\)"),
    (lambda m: (m / "model.json").write_text(json.dumps({**json.loads((m / "model.json").read_text()),
                                                         "model": {"name": "lr", "dim": "x"}})),  # was TypeError
     r"m: its model.json is not one train --save writes \(TypeError: .*'dim'\)"),
    (lambda m: (m / "model.json").write_text('{"bad json'), r"m: the model files are damaged"),
    (lambda m: np.savez(m / "table.npz", keys=np.arange(3, dtype=np.uint64), values=np.zeros((2, 1), np.float32)),
     r"table.npz holds \(3,\) keys and \(2, 1\) values for rows of 1 \(its model.json's lr\): the model files are "
     r"damaged or of two models"),
    # an FM's table beside an LR's model.json: scored with its first column, without a word
    (lambda m: np.savez(m / "table.npz", keys=np.arange(3, dtype=np.uint64), values=np.zeros((3, 9), np.float32)),
     r"\(3, 9\) values for rows of 1 \(its model.json's lr\): the model files are damaged or of two models"),
    (lambda m: np.savez(m / "table.npz", keys=np.arange(3, dtype=np.uint64),  # NaN predictions, eval's logloss NaN
                        values=np.array([[0.5], [np.nan], [np.inf]], np.float32)),
     r"m: the model's table holds 2 NaN or infinite weights: its files are damaged, or the training diverged"),
    (lambda m: (m / "model.json").write_text(json.dumps({**json.loads((m / "model.json").read_text()),
                                                         "format": "paramserver-model-99"})),  # read as the first
     r"m: its model.json says format 'paramserver-model-99', and this paramserver reads 'paramserver-model-1'"),
])
def test_damaged_model_files_are_named_with_the_fix(tmp_path, damage, says):
    folder = _saved(tmp_path)
    damage(folder)
    with pytest.raises(DataError, match=says):
        load_model(str(folder))


def test_a_file_given_as_the_model_is_said_to_be_one(tmp_path):
    path = tmp_path / "rows.tsv"
    path.write_text("1\t2\n")
    with pytest.raises(DataError, match=r"rows.tsv is a file, not a saved model: --model takes the folder"):
        load_model(str(path))


def test_a_csv_override_needs_a_model_that_names_its_label_column(tmp_path):
    """eval --format csv on a Criteo model said '--format csv needs --label COLUMN', a flag
    eval does not have."""
    from paramserver.errors import ConfigError

    model = load_model(str(_saved(tmp_path)))
    assert model.scoring_format().name == "criteo" and model.scoring_format(True).skip_bad
    with pytest.raises(ConfigError, match=r"--format csv: the model was trained on criteo rows, which name no label"):
        model.scoring_format(overrides={"name": "csv"})
