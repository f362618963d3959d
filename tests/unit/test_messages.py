"""Issue 43's messages (items 21, 22, 24, 25): a resume refused flag by flag with the command
that resumes, a duplicated key of a spec refused, the report's storage and bytes a key, the
prewarm's progress."""

import pytest

from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.resume import _check_tables
from paramserver.apps.ctr.train_config import TrainConfig
from paramserver.data.reader import DataFormat
from paramserver.errors import ConfigError
from paramserver.filters.chain import FilterSpec
from paramserver.lifecycle.spec import Lifecycle


# ---- 24: a key given twice in a spec ---------------------------------------------------------------
@pytest.mark.parametrize("text, said", [
    ("push=int8;push=fp16", "the direction 'push' is given twice (push=int8 and push=fp16)"),
    ("push=keycache;pull=keycache;push=zstd", "the direction 'push' is given twice (push=keycache and push=zstd)"),
    ("push=int8,keycache,int8", "filters for push: int8 listed twice"),
    ("push=int8:block=128:block=64", "the setting 'block' is given twice"),
])
def test_a_filter_spec_that_gives_a_key_twice_is_refused_with_the_fix(text, said):
    with pytest.raises(ConfigError, match="give it once|list each filter once") as refused:
        FilterSpec.parse(text)
    assert said in str(refused.value)


def test_a_duplicated_direction_is_refused_on_the_command_line_flag():
    with pytest.raises(ConfigError, match=r"--filters 'push=int8;push=fp16': .*'push=int8' or 'push=fp16'"):
        TrainConfig(filters="push=int8;push=fp16")


@pytest.mark.parametrize("text, said", [
    ("ttl=1e6;ttl=2e6", "ttl is given twice (ttl=1e6 and ttl=2e6)"),
    ("admit=after:2;ttl=5e6;admit=prob:0.5", "admit is given twice (admit=after:2 and admit=prob:0.5)"),
    ("track;track", "track is given twice"),
    ("admit=after:n=2,n=3", "n is given twice"),
])
def test_a_lifecycle_spec_that_gives_a_setting_twice_is_refused(text, said):
    with pytest.raises(ConfigError, match="give (each setting|it) once") as refused:
        Lifecycle.parse(text)
    assert said in str(refused.value)


def test_specs_that_give_each_key_once_still_parse():
    assert str(FilterSpec.parse("push=int8,keycache;pull=keycache;reply=fp16")) == \
        "push=int8,keycache;pull=keycache;reply=fp16"
    assert str(Lifecycle.parse("admit=after:2;ttl=1e6;cap_keys=1000")) == "admit=after:2;ttl=1e+06;cap_keys=1000"


# ---- 21: a resume refused flag by flag ----------------------------------------------------------------
def _manifest(cfg: TrainConfig) -> dict:
    spec = cfg.table_spec(None)
    return {"tables": {spec.name: spec.to_wire()},
            "train": {"model": {"name": cfg.model.name, "k": cfg.model.k, "l2": cfg.model.l2,
                                "hidden": list(cfg.model.hidden)}}}


def test_a_resume_with_other_settings_names_each_flag_both_values_and_the_command(monkeypatch):
    checkpointed = TrainConfig(Model("fm", k=4), DataFormat("criteo"), storage="fp16",
                               lifecycle="admit=after:2;ttl=1e6")
    asked = TrainConfig(Model("fm", k=4), DataFormat("criteo"), seed=3)
    monkeypatch.setattr("sys.argv", ["/venv/bin/paramserver", "train", "--data", "a b.tsv", "--resume", "ck",
                                     "--storage=float32", "--seed", "3", "--model", "fm", "--k", "4"])
    with pytest.raises(ConfigError) as refused:
        _check_tables("ck/step-9", _manifest(checkpointed), asked.table_spec(None), asked)
    said = str(refused.value)
    assert "--storage: the checkpoint has fp16, this command asks float32" in said
    assert "--lifecycle: the checkpoint has 'admit=after:2;ttl=1e+06', this command asks none" in said
    assert "--seed: the checkpoint has 0, this command asks 3" in said
    assert "--optimizer" not in said and "{" not in said and len(said) < 600  # no table dicts
    assert said.endswith("resume with the checkpoint's settings: paramserver train --data 'a b.tsv' --resume ck "
                         "--model fm --k 4 --seed 0 --lifecycle 'admit=after:2;ttl=1e+06' --storage fp16")


def test_a_resume_from_python_is_told_the_flags_to_pass(monkeypatch):
    monkeypatch.setattr("sys.argv", ["pytest"])
    checkpointed = TrainConfig(Model("lr"), storage="bf16")
    asked = TrainConfig(Model("lr"))
    with pytest.raises(ConfigError, match=r"--storage: the checkpoint has bf16, this command asks float32; "
                                          r"pass the checkpoint's --storage bf16$"):
        _check_tables("ck/step-9", _manifest(checkpointed), asked.table_spec(None), asked)
